package dynamo

import (
	"errors"
	"net"

	"github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// ErrRetriesExhausted means a request was throttled or conflicted on every
// attempt the RetryPolicy allowed. From Apply it means the batch was surely
// not applied (it is never combined with relaycore.ErrMaybeApplied unless
// an earlier attempt was ambiguous, in which case the error says so). It
// always comes with relaycore.ErrUnavailable (as does an Apply that gave up
// after ambiguous attempts, with ErrMaybeApplied): a host answers it as
// "retry later".
var ErrRetriesExhausted = errors.New("dynamodb: retries exhausted")

// failure classifies an error from one DynamoDB request.
type failure int

const (
	// failPermanent: rejected (validation, missing table, access); the
	// request was not applied and repeating it will not help.
	failPermanent failure = iota
	// failThrottled: throttled or lost a transaction conflict; not applied,
	// worth retrying after a back-off.
	failThrottled
	// failNotSent: the connection failed before the request was written
	// (dial error); not applied, worth retrying.
	failNotSent
	// failAmbiguous: sent, outcome unknown (lost response, timeout, 5xx,
	// transaction in progress under the same token).
	failAmbiguous
	// failCondition: a TransactWriteItems condition, or a PutItem's or
	// DeleteItem's ConditionExpression, was false; not applied.
	failCondition
)

// Cancellation reason codes that mean "try again" rather than "no".
var retryableReasons = map[string]bool{
	"ThrottlingError":               true,
	"ProvisionedThroughputExceeded": true,
	"TransactionConflict":           true,
	"RequestLimitExceeded":          true,
}

// API error codes that mean the request was refused before it ran.
var throttleCodes = map[string]bool{
	"ThrottlingException":                    true,
	"ProvisionedThroughputExceededException": true,
	"RequestLimitExceeded":                   true,
	"TransactionConflictException":           true,
	"LimitExceededException":                 true,
}

func classify(err error) failure {
	var tce *types.TransactionCanceledException
	if errors.As(err, &tce) {
		retry := false
		for _, r := range tce.CancellationReasons {
			code := ""
			if r.Code != nil {
				code = *r.Code
			}
			if code == "ConditionalCheckFailed" {
				return failCondition
			}
			if retryableReasons[code] {
				retry = true
			}
		}
		if retry {
			return failThrottled
		}
		return failPermanent
	}
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return failCondition
	}
	var se *smithy.SerializationError
	if errors.As(err, &se) {
		return failPermanent
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		code := api.ErrorCode()
		switch {
		case throttleCodes[code]:
			return failThrottled
		case code == "TransactionInProgressException":
			// An earlier attempt with this token is still running.
			return failAmbiguous
		case code == "InternalServerError" || code == "ServiceUnavailable":
			return failAmbiguous
		}
		var re *http.ResponseError
		if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
			return failAmbiguous
		}
		return failPermanent
	}
	var re *http.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() >= 500 {
		return failAmbiguous
	}
	var send *smithyhttp.RequestSendError
	if errors.As(err, &send) {
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return failNotSent
		}
		return failAmbiguous
	}
	// Anything else (a truncated response body, a context that ended
	// mid-flight) happened after the request may have been sent.
	return failAmbiguous
}
