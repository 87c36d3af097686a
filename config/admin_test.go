package config_test

import (
	"strings"
	"testing"
)

// TestAdminToken: the token is required when admin.listen is not loopback
// (SPEC §6), optional on loopback, and never shown by Redacted.
func TestAdminToken(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:9464", ":9464", "10.0.0.5:9464"} {
		err := loadErr(t, laneYAML("admin: {listen: \""+listen+"\"}"))
		if !strings.Contains(err.Error(), "admin.token: required when admin.listen") {
			t.Errorf("listen %s without a token: %v, want admin.token required", listen, err)
		}
	}
	for _, listen := range []string{"127.0.0.1:9464", "localhost:0", "[::1]:9464"} {
		mustLoad(t, laneYAML("admin: {listen: \""+listen+"\"}"))
	}
	t.Setenv("TEST_ADMIN_TOKEN", "s3cret-token")
	c, _ := mustLoad(t, laneYAML("admin: {listen: \"0.0.0.0:9464\", token: \"${TEST_ADMIN_TOKEN}\"}"))
	if c.Admin.Token != "s3cret-token" {
		t.Fatalf("token = %q, want it expanded", c.Admin.Token)
	}
	if r := c.Redacted().Admin.Token; strings.Contains(r, "s3cret") {
		t.Errorf("Redacted shows the token: %q", r)
	}
}
