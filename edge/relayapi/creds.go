package relayapi

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/credentials/endpointcreds"
	"github.com/aws/aws-sdk-go-v2/credentials/processcreds"
)

// Credentials for SigV4: the SDK's default chain, in its order, with the
// SDK's own providers, but without the ones that need an STS or SSO
// client (a profile's role_arn, sso_session or web_identity_token_file,
// and AWS_WEB_IDENTITY_TOKEN_FILE), which are refused with a message
// instead. Linking aws-sdk-go-v2/config for them (it brings the STS, SSO,
// SSO-OIDC and sign-in clients, whose endpoint tables are built at
// process start) made every edged 4.6 MB larger and 3 MiB heavier in
// memory, with relay_api off or on: the device budget of 32 MiB was
// exceeded in TestFootprint. A device is given credentials by the
// environment, a credentials file, a credential_process, its container
// (ECS, Greengrass: AWS_CONTAINER_CREDENTIALS_*) or its instance role.
//
// The order, first that applies:
//  1. AWS_ACCESS_KEY_ID (or AWS_ACCESS_KEY) and AWS_SECRET_ACCESS_KEY (or
//     AWS_SECRET_KEY), with AWS_SESSION_TOKEN;
//  2. the profile AWS_PROFILE (default "default") in the credentials file
//     (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials), then in
//     the config file (AWS_CONFIG_FILE, default ~/.aws/config): static
//     keys or credential_process;
//  3. the container's endpoint, AWS_CONTAINER_CREDENTIALS_FULL_URI or
//     AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, with
//     AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE);
//  4. the instance's role through IMDS, unless AWS_EC2_METADATA_DISABLED.
//
// Credentials that expire are refreshed (aws.CredentialsCache).
func defaultCredentials() (aws.CredentialsProvider, string, error) {
	p, source, err := resolveCredentials()
	if err != nil {
		return nil, "", err
	}
	return aws.NewCredentialsCache(p), source, nil
}

func resolveCredentials() (aws.CredentialsProvider, string, error) {
	id := firstEnv("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY")
	secret := firstEnv("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_KEY")
	if id != "" && secret != "" {
		return credentials.NewStaticCredentialsProvider(id, secret, os.Getenv("AWS_SESSION_TOKEN")), "environment", nil
	}
	if os.Getenv("AWS_WEB_IDENTITY_TOKEN_FILE") != "" {
		return nil, "", errors.New("AWS_WEB_IDENTITY_TOKEN_FILE: web identity credentials need STS, which edged does not link; give the device static keys, a credential_process, container or instance credentials")
	}
	profile := os.Getenv("AWS_PROFILE")
	if profile == "" {
		profile = "default"
	}
	home, _ := os.UserHomeDir()
	for _, f := range []struct {
		env, def, section string
	}{
		{"AWS_SHARED_CREDENTIALS_FILE", filepath.Join(home, ".aws", "credentials"), profile},
		{"AWS_CONFIG_FILE", filepath.Join(home, ".aws", "config"), configSection(profile)},
	} {
		path := os.Getenv(f.env)
		if path == "" {
			path = f.def
		}
		kv, err := iniSection(path, f.section)
		if err != nil {
			return nil, "", err
		}
		if kv == nil {
			continue
		}
		for _, k := range []string{"role_arn", "sso_session", "sso_start_url", "web_identity_token_file", "login_session"} {
			if kv[k] != "" {
				return nil, "", fmt.Errorf("%s [%s]: %s needs STS or SSO, which edged does not link; use static keys or credential_process", path, f.section, k)
			}
		}
		switch {
		case kv["aws_access_key_id"] != "" && kv["aws_secret_access_key"] != "":
			return credentials.NewStaticCredentialsProvider(kv["aws_access_key_id"], kv["aws_secret_access_key"], kv["aws_session_token"]),
				path + " [" + f.section + "]", nil
		case kv["credential_process"] != "":
			return processcreds.NewProvider(kv["credential_process"]), path + " [" + f.section + "] credential_process", nil
		}
	}
	if full, rel := os.Getenv("AWS_CONTAINER_CREDENTIALS_FULL_URI"), os.Getenv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); full != "" || rel != "" {
		uri := full
		if uri == "" {
			uri = "http://169.254.170.2" + rel
		}
		return endpointcreds.New(uri, func(o *endpointcreds.Options) {
			o.AuthorizationToken = os.Getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN")
			if f := os.Getenv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"); f != "" {
				o.AuthorizationTokenProvider = tokenFile(f)
			}
		}), "container endpoint " + uri, nil
	}
	if strings.EqualFold(os.Getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		return nil, "", errors.New("no AWS credentials: none in the environment or the shared files, no container endpoint, and IMDS is disabled (AWS_EC2_METADATA_DISABLED)")
	}
	return ec2rolecreds.New(), "instance role (IMDS)", nil
}

// tokenFile reads the container's authorization token at each refresh:
// the agent rotates it.
type tokenFile string

func (f tokenFile) GetToken() (string, error) {
	b, err := os.ReadFile(string(f))
	return strings.TrimSpace(string(b)), err
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// configSection is profile's section name in the config file.
func configSection(profile string) string {
	if profile == "default" {
		return "default"
	}
	return "profile " + profile
}

// iniSection returns the keys of [section] in the INI file at path, nil
// if the file or the section is absent.
func iniSection(path, section string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("aws credentials: %w", err)
	}
	defer f.Close()
	var kv map[string]string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && strings.HasSuffix(line, "]"):
			in = strings.Join(strings.Fields(line[1:len(line)-1]), " ") == section
			if in && kv == nil {
				kv = map[string]string{}
			}
		case in:
			if k, v, ok := strings.Cut(line, "="); ok {
				kv[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("aws credentials %s: %w", path, err)
	}
	return kv, nil
}
