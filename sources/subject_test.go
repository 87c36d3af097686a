package sources

import "testing"

func TestSubjectCovers(t *testing.T) {
	for _, tc := range []struct {
		have, want string
		ok         bool
	}{
		{"a.>", "a.b.>", true}, {"a.>", "a.b", true}, {"a.>", "a", false}, {"a.*", "a.b", true},
		{"a.*", "a.>", false}, {"a.*", "a.b.c", false}, {"a.b", "a.b", true}, {"a.b", "a.c", false},
		{">", "x.y", true}, {"a.*.c", "a.b.c", true}, {"a.b.>", "a.>", false},
	} {
		if got := subjectCovers(tc.have, tc.want); got != tc.ok {
			t.Errorf("subjectCovers(%q, %q) = %v, want %v", tc.have, tc.want, got, tc.ok)
		}
	}
}
