package admit

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Limits on what a message carries and what a field may hold.
const (
	// MaxWarningBytes is the length of one warning: the API server and
	// kubectl show up to 120 characters of each.
	MaxWarningBytes = 120
	// maxMessageBytes bounds a denial message.
	maxMessageBytes = 2048
	// MaxValueBytes caps every free-form value the rules read (label and
	// annotation values we consume, policy strings): longer values are denied
	// before any further work, as Istio caps its free-form fields.
	MaxValueBytes = 1024
	// maxQuoted is how much of a user-supplied value a message repeats.
	maxQuoted = 63
)

// finding is one rule's verdict on one field.
type finding struct {
	rule  string
	field string
	msg   string
	code  int32
}

func (f finding) String() string {
	if f.field == "" {
		return f.msg
	}
	return f.field + ": " + f.msg
}

// report collects the findings of one request.
type report struct {
	denials  []finding
	warnings []finding
	patch    []patchOp
	access   *AccessReview
	err      *finding // an internal failure: the request cannot be decided
	skipped  bool     // no rule applies to this object
}

// skip records that no rule applies (a Gateway of another class, say).
func (r *report) skip() { r.skipped = true }

// deny records an invalid field (422 Invalid).
func (r *report) deny(rule, field, format string, args ...any) {
	r.denials = append(r.denials, finding{rule, field, fmt.Sprintf(format, args...), http.StatusUnprocessableEntity})
}

// forbid records an authorization failure (403 Forbidden).
func (r *report) forbid(rule, field, format string, args ...any) {
	r.denials = append(r.denials, finding{rule, field, fmt.Sprintf(format, args...), http.StatusForbidden})
}

// warn records a warning; the request is still allowed.
func (r *report) warn(rule, field, format string, args ...any) {
	r.warnings = append(r.warnings, finding{rule, field, fmt.Sprintf(format, args...), 0})
}

// fail records that the request could not be decided (500).
func (r *report) fail(rule, format string, args ...any) {
	if r.err == nil {
		r.err = &finding{rule: rule, msg: fmt.Sprintf(format, args...), code: http.StatusInternalServerError}
	}
}

// result turns the findings into the answer.
func (r *report) result() Result {
	res := Result{Access: r.access}
	for _, w := range r.warnings {
		res.Warnings = append(res.Warnings, clip(w.String(), MaxWarningBytes))
		res.Rules = append(res.Rules, w.rule)
	}
	for _, d := range r.denials {
		res.Rules = append(res.Rules, d.rule)
	}
	slices.Sort(res.Rules)
	res.Rules = slices.Compact(res.Rules)
	switch {
	case r.err != nil:
		res.Decision, res.Code, res.Reason, res.Message = Error, r.err.code, r.err.rule, r.err.msg
	case len(r.denials) > 0:
		first := r.denials[0]
		res.Decision, res.Code, res.Reason = Deny, first.code, first.rule
		msgs := make([]string, len(r.denials))
		for i, d := range r.denials {
			msgs[i] = d.String()
			cause := metav1.CauseTypeFieldValueInvalid
			if d.code == http.StatusForbidden {
				cause = metav1.CauseTypeForbidden
			}
			res.Causes = append(res.Causes, metav1.StatusCause{
				Type:    cause,
				Message: d.msg,
				Field:   d.field,
			})
		}
		res.Message = clip(strings.Join(msgs, "; "), maxMessageBytes)
	case len(r.patch) > 0:
		res.Decision, res.Reason = Patch, "defaulted"
		res.Patch = marshalPatch(r.patch)
	case r.skipped:
		res.Decision, res.Reason = Allow, "not-applicable"
	default:
		res.Decision, res.Reason = Allow, "ok"
	}
	return res
}

// clip shortens s to at most n bytes on a rune boundary, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "..."
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}

// q quotes a user-supplied value for a message: escaped (no control
// character reaches a terminal or log) and shortened.
func q(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(clip(s, maxQuoted))
	}
	return strconv.Quote(s)
}

// badChar reports the first control, bidirectional-formatting or invalid
// UTF-8 character of s, which no value we consume may hold.
func badChar(s string) (rune, bool) {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				return r, true
			}
		}
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return r, true
		}
	}
	return 0, false
}

// checkValue applies the rules every consumed free-form value obeys: at
// most MaxValueBytes, no control characters. It reports false (after a
// denial) when the value is unusable.
func checkValue(rep *report, rule, field, v string) bool {
	if len(v) > MaxValueBytes {
		rep.deny(rule, field, "value is %d bytes, more than the %d allowed; shorten it", len(v), MaxValueBytes)
		return false
	}
	if r, bad := badChar(v); bad {
		rep.deny(rule, field, "value %s holds the character %U, which is not allowed; remove it", q(v), r)
		return false
	}
	return true
}

// labelField is the path of a label or annotation key: metadata.labels[key].
func labelField(base, key string) string { return base + "[" + key + "]" }

// oneOf renders allowed values for a message: a, b or c.
func oneOf(vals ...string) string {
	switch len(vals) {
	case 0:
		return ""
	case 1:
		return vals[0]
	}
	return strings.Join(vals[:len(vals)-1], ", ") + " or " + vals[len(vals)-1]
}
