package relayapi

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clearAWSEnv leaves the test with no AWS setting of the process's own.
func clearAWSEnv(t *testing.T) string {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "AWS_") {
			t.Setenv(k, "")
		}
	}
	dir := t.TempDir()
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	return dir
}

// TestDefaultCredentials: the chain's sources in order, each retrieved
// through the SDK's own provider, and the profiles that would need STS or
// SSO refused by name.
func TestDefaultCredentials(t *testing.T) {
	write := func(t *testing.T, path, body string) {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	container := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "tok-1" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, `{"AccessKeyId":"AKIDCONTAINER","SecretAccessKey":"s","Token":"t","Expiration":%q}`, time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	}))
	defer container.Close()
	for _, tc := range []struct {
		name   string
		setup  func(t *testing.T, dir string)
		key    string // the access key id retrieved, or
		refuse string // a fragment of the refusal
	}{
		{"environment", func(t *testing.T, dir string) {
			t.Setenv("AWS_ACCESS_KEY_ID", "AKIDENV")
			t.Setenv("AWS_SECRET_ACCESS_KEY", "s")
			write(t, filepath.Join(dir, "credentials"), "[default]\naws_access_key_id = AKIDFILE\naws_secret_access_key = s\n")
		}, "AKIDENV", ""},
		{"credentials file, AWS_PROFILE", func(t *testing.T, dir string) {
			t.Setenv("AWS_PROFILE", "edge")
			write(t, filepath.Join(dir, "credentials"), "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s\n\n[edge]\naws_access_key_id = AKIDEDGE\naws_secret_access_key = s\n")
		}, "AKIDEDGE", ""},
		{"config file profile", func(t *testing.T, dir string) {
			t.Setenv("AWS_PROFILE", "edge")
			write(t, filepath.Join(dir, "config"), "[profile edge]\naws_access_key_id=AKIDCONFIG\naws_secret_access_key=s\n")
		}, "AKIDCONFIG", ""},
		{"assume role refused", func(t *testing.T, dir string) {
			write(t, filepath.Join(dir, "config"), "[default]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = base\n")
		}, "", "role_arn needs STS or SSO"},
		{"web identity refused", func(t *testing.T, dir string) {
			t.Setenv("AWS_WEB_IDENTITY_TOKEN_FILE", filepath.Join(dir, "token"))
		}, "", "web identity credentials need STS"},
		{"container endpoint", func(t *testing.T, dir string) {
			t.Setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", container.URL+"/creds")
			write(t, filepath.Join(dir, "token"), "tok-1\n")
			t.Setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", filepath.Join(dir, "token"))
		}, "AKIDCONTAINER", ""},
		{"nothing, IMDS off", func(*testing.T, string) {}, "", "IMDS is disabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := clearAWSEnv(t)
			tc.setup(t, dir)
			p, source, err := defaultCredentials()
			if tc.refuse != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refuse) {
					t.Fatalf("err %v, want ...%s...", err, tc.refuse)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := p.Retrieve(context.Background())
			if err != nil || c.AccessKeyID != tc.key {
				t.Fatalf("from %s: %+v %v, want %s", source, c, err, tc.key)
			}
		})
	}
}
