// Package session holds the session settings the PostgreSQL store's
// statements are written for, shared by infra/postgres (ConfigurePool)
// and its test cluster (pgtest's shared database), which cannot import
// infra/postgres.
package session

import "github.com/jackc/pgx/v5/pgconn"

// Settings are the run-time parameters every relay session sets at
// connect (the startup packet: no extra round trip); postgres.ConfigurePool
// documents why.
var Settings = [][2]string{
	{"plan_cache_mode", "force_generic_plan"},
	{"enable_seqscan", "off"},
}

// Configure adds Settings to cfg's run-time parameters, leaving alone any
// the connection string set.
func Configure(cfg *pgconn.Config) {
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	for _, s := range Settings {
		if _, ok := cfg.RuntimeParams[s[0]]; !ok {
			cfg.RuntimeParams[s[0]] = s[1]
		}
	}
}
