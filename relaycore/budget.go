package relaycore

import (
	"fmt"
	"math"
	"strings"
)

// Budgets from the original design (docs/engine.md, "Budgets"). Free stays below
// Cloudflare Free's 50 subrequests per call: 2 fires × 8 targets × 2 calls =
// 32 target calls per alarm.
const (
	// workerFreeRelayFires is Worker Free relay fires per alarm.
	workerFreeRelayFires = 2
	// workerFreeRelayTargets is Worker Free relay targets attempted per fire.
	workerFreeRelayTargets = 8
	// workerPaidRelayFires is Worker Paid relay fires per alarm.
	workerPaidRelayFires = 8
	// workerPaidRelayTargets is Worker Paid relay targets attempted per fire.
	workerPaidRelayTargets = 32
	// workerRelayCallsPerTarget is the target apply calls allowed per target
	// per fire (the first attempt plus one retry on contention).
	workerRelayCallsPerTarget = 2
	// RelayLagBoundMS (P-15): consumers allow a 60-second relay lag window.
	// The sweeper's one-minute period and the back-off cap keep an
	// undisturbed source within it; a mid-cycle append can exceed it.
	RelayLagBoundMS = 60000
	// MaxBlockedTargets bounds the blocked set; a target that fails while
	// it is full has its rows held aside for a later retry instead.
	MaxBlockedTargets = 32
)

// Rows per fire for each plan. Not part of the original design's table: a
// fire's row budget bounds the checkpoint and the hook work, and a fire
// inspects at most 4× it. Large enough that targets' rows are applied in
// few target batches, small enough that a fire stays short.
const (
	workerFreeRelayRows = 256
	workerPaidRelayRows = 1024
)

// RelayBudget is a source's work per fire (and fires per alarm). Targets are
// processed sequentially within a fire.
type RelayBudget struct {
	// FiresPerAlarm bounds the fires one Alarm call runs.
	FiresPerAlarm int
	// TargetsPerFire bounds the distinct targets one fire attempts.
	TargetsPerFire int
	// CallsPerTarget bounds the target apply calls per target per fire.
	CallsPerTarget int
	// RowsPerFire bounds the rows one fire collects for delivery; the fire
	// inspects at most 4×RowsPerFire rows.
	RowsPerFire int
}

// PlanBudget returns the budget of a plan: "free" or "paid" (any case).
func PlanBudget(plan string) (RelayBudget, error) {
	switch strings.ToLower(strings.TrimSpace(plan)) {
	case "free":
		return RelayBudget{workerFreeRelayFires, workerFreeRelayTargets, workerRelayCallsPerTarget, workerFreeRelayRows}, nil
	case "paid":
		return RelayBudget{workerPaidRelayFires, workerPaidRelayTargets, workerRelayCallsPerTarget, workerPaidRelayRows}, nil
	}
	return RelayBudget{}, fmt.Errorf("plan %q: %w (want free or paid)", plan, ErrUnknownPlan)
}

// orFree fills zero fields from the free plan, so the zero RelayHandler
// runs with the smallest budget rather than none.
func (b RelayBudget) orFree() RelayBudget {
	free, _ := PlanBudget("free")
	if b.FiresPerAlarm <= 0 {
		b.FiresPerAlarm = free.FiresPerAlarm
	}
	if b.TargetsPerFire <= 0 {
		b.TargetsPerFire = free.TargetsPerFire
	}
	if b.CallsPerTarget <= 0 {
		b.CallsPerTarget = free.CallsPerTarget
	}
	if b.RowsPerFire <= 0 {
		b.RowsPerFire = free.RowsPerFire
	}
	return b
}

// TargetCallsPerAlarm is the most target apply calls one alarm may make.
func (b RelayBudget) TargetCallsPerAlarm() int {
	return satMul(b.FiresPerAlarm, satMul(b.TargetsPerFire, b.CallsPerTarget))
}

// targetCallsPerFire is the most target apply calls one fire may make.
func (b RelayBudget) targetCallsPerFire() int { return satMul(b.TargetsPerFire, b.CallsPerTarget) }

// inspectPerFire is the most rows one fire may inspect: 4×RowsPerFire.
func (b RelayBudget) inspectPerFire() int { return satMul(4, b.RowsPerFire) }

// satMul multiplies non-negative budget figures, saturating instead of
// wrapping, so a huge configured budget means "unbounded", never negative.
func satMul(a, b int) int {
	if a > 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}
