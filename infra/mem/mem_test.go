package mem_test

import (
	"testing"

	"github.com/relay-dev/relay/infra/mem"
	"github.com/relay-dev/relay/relaycore"
	"github.com/relay-dev/relay/relaycore/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) relaycore.Store {
		return mem.New(relaycore.Capabilities{})
	})
}
