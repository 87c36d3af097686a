package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"go.yaml.in/yaml/v3"
)

// AdminListen returns the admin.listen of the config file at path as the
// operator commands need it (SPEC §5: their default --admin): the
// SHAPER_ADMIN_LISTEN environment variable, else the file's admin.listen,
// else DefaultAdminListen. Only that key is read, so a config whose other
// parts do not load here (a sink secret not set in the operator's shell)
// still names its daemon. When explicit is true the file must exist; the
// default path may be missing. Errors: the file cannot be read, or is not
// YAML.
func AdminListen(path string, explicit bool) (string, error) {
	if v := os.Getenv("SHAPER_ADMIN_LISTEN"); v != "" {
		return v, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !explicit {
		return DefaultAdminListen, nil
	}
	if err != nil {
		return "", err
	}
	var doc struct {
		Admin struct {
			Listen string `yaml:"listen"`
		} `yaml:"admin"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if doc.Admin.Listen == "" {
		return DefaultAdminListen, nil
	}
	return doc.Admin.Listen, nil
}
