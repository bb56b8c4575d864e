package alarmclock_test

import (
	"os"
	"testing"

	"github.com/relay-dev/relay/infra/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
