package hbone

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// CONNECT metadata headers that HBONE peers exchange. They pass through the
// tunnel untouched; these helpers build and read them.
const (
	HeaderForwarded   = "forwarded"
	HeaderBaggage     = "baggage"
	HeaderTraceparent = "traceparent"
)

// Forwarded is one element of an RFC 7239 Forwarded header. ztunnel sends
// `for="<client ip:port>"` and, when it knows the destination service,
// `;host=<service hostname>`.
type Forwarded struct {
	// For is the client socket address, when it is one; ForRaw keeps the value
	// as sent (it may be an obfuscated identifier such as "_hidden" or "unknown").
	For    netip.AddrPort
	ForRaw string
	Host   string
	Proto  string
	By     string
}

// String formats the element the way ztunnel does: for= quoted, then host.
func (f Forwarded) String() string {
	var b strings.Builder
	forv := f.ForRaw
	if f.For.IsValid() {
		forv = f.For.String()
	}
	if forv != "" {
		b.WriteString("for=")
		b.WriteString(quote(forv))
	}
	for _, kv := range [...][2]string{{"host", f.Host}, {"proto", f.Proto}, {"by", f.By}} {
		if kv[1] == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(';')
		}
		b.WriteString(kv[0])
		b.WriteByte('=')
		b.WriteString(quoteIfNeeded(kv[1]))
	}
	return b.String()
}

// maxMetadataLen bounds a header value these parsers will look at.
const maxMetadataLen = 8192

// ParseForwarded parses a Forwarded header value (RFC 7239 §4) into its
// elements, first (closest to the original client) first.
func ParseForwarded(v string) ([]Forwarded, error) {
	if len(v) > maxMetadataLen {
		return nil, fmt.Errorf("forwarded header is %d bytes, more than %d", len(v), maxMetadataLen)
	}
	var out []Forwarded
	p := listParser{s: v}
	for {
		var f Forwarded
		for {
			p.skipSpace()
			key, err := p.token()
			if err != nil {
				return nil, fmt.Errorf("forwarded: %w", err)
			}
			if !p.consume('=') {
				return nil, fmt.Errorf("forwarded: parameter %q has no '='", key)
			}
			val, err := p.value()
			if err != nil {
				return nil, fmt.Errorf("forwarded: parameter %q: %w", key, err)
			}
			switch strings.ToLower(key) {
			case "for":
				f.ForRaw = val
				f.For = parseNodeAddr(val)
			case "host":
				f.Host = val
			case "proto":
				f.Proto = val
			case "by":
				f.By = val
			}
			p.skipSpace()
			if !p.consume(';') {
				break
			}
		}
		out = append(out, f)
		p.skipSpace()
		if p.done() {
			return out, nil
		}
		if !p.consume(',') {
			return nil, fmt.Errorf("forwarded: unexpected %q at offset %d", p.s[p.i], p.i)
		}
	}
}

// parseNodeAddr reads an RFC 7239 node ("1.2.3.4:5", "[::1]:5"); ports are optional there.
func parseNodeAddr(v string) netip.AddrPort {
	if ap, err := netip.ParseAddrPort(v); err == nil {
		return ap
	}
	if a, err := netip.ParseAddr(strings.Trim(v, "[]")); err == nil {
		return netip.AddrPortFrom(a, 0)
	}
	return netip.AddrPort{}
}

// Member is one list-member of a W3C baggage header: key=value with optional
// properties, the value already percent-decoded.
type Member struct {
	Key        string
	Value      string
	Properties string // raw, after the first ';'
}

// W3C baggage limits (https://www.w3.org/TR/baggage/#limits).
const (
	maxBaggageMembers = 180
	maxBaggageLen     = 8192
)

// ParseBaggage parses a W3C baggage header value.
func ParseBaggage(v string) ([]Member, error) {
	if len(v) > maxBaggageLen {
		return nil, fmt.Errorf("baggage is %d bytes, more than %d", len(v), maxBaggageLen)
	}
	var out []Member
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if len(out) == maxBaggageMembers {
			return nil, fmt.Errorf("baggage has more than %d members", maxBaggageMembers)
		}
		kv, props, _ := strings.Cut(item, ";")
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("baggage member %q has no '='", item)
		}
		k, val = strings.TrimSpace(k), strings.TrimSpace(val)
		if k == "" || !isToken(k) {
			return nil, fmt.Errorf("baggage key %q is not a token", k)
		}
		dec, err := percentDecode(val)
		if err != nil {
			return nil, fmt.Errorf("baggage value of %q: %w", k, err)
		}
		out = append(out, Member{Key: k, Value: dec, Properties: strings.TrimSpace(props)})
	}
	return out, nil
}

// FormatBaggage formats members as a baggage header value, percent-encoding values.
func FormatBaggage(ms []Member) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(m.Key)
		b.WriteByte('=')
		b.WriteString(percentEncode(m.Value))
		if m.Properties != "" {
			b.WriteByte(';')
			b.WriteString(m.Properties)
		}
	}
	return b.String()
}

// listParser walks a header value byte by byte.
type listParser struct {
	s string
	i int
}

func (p *listParser) done() bool { return p.i >= len(p.s) }

func (p *listParser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *listParser) consume(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *listParser) token() (string, error) {
	start := p.i
	for p.i < len(p.s) && isTokenChar(p.s[p.i]) {
		p.i++
	}
	if p.i == start {
		if p.done() {
			return "", errors.New("missing parameter name at the end")
		}
		return "", fmt.Errorf("unexpected %q at offset %d, want a parameter name", p.s[p.i], p.i)
	}
	return p.s[start:p.i], nil
}

// value reads a token or a quoted-string (RFC 9110 §5.6.4).
func (p *listParser) value() (string, error) {
	if !p.consume('"') {
		return p.token()
	}
	var b strings.Builder
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '"':
			return b.String(), nil
		case c == '\\':
			if p.i >= len(p.s) {
				return "", errors.New("quoted string ends in a backslash")
			}
			// quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
			if e := p.s[p.i]; isCTL(e) {
				return "", fmt.Errorf("control character %#x escaped in a quoted string", e)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case isCTL(c):
			return "", fmt.Errorf("control character %#x in a quoted string", c)
		default:
			b.WriteByte(c)
		}
	}
	return "", errors.New("quoted string has no closing quote")
}

// isCTL reports a control character that a quoted-string may not hold (HTAB aside).
func isCTL(c byte) bool { return c < 0x20 && c != '\t' || c == 0x7f }

func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTokenChar(s[i]) {
			return false
		}
	}
	return s != ""
}

func quoteIfNeeded(s string) string {
	if isToken(s) {
		return s
	}
	return quote(s)
}

// quote writes s as an RFC 9110 quoted-string, escaping '"' and '\'.
func quote(s string) string {
	return `"` + quoteEscaper.Replace(s) + `"`
}

var quoteEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`)

// baggage-octet (W3C baggage): printable ASCII except space, '"', ',', ';' and '\'.
func isBaggageOctet(c byte) bool {
	return c > 0x20 && c < 0x7f && c != '"' && c != ',' && c != ';' && c != '\\'
}

func percentDecode(s string) (string, error) {
	if !strings.ContainsRune(s, '%') {
		for i := 0; i < len(s); i++ {
			if !isBaggageOctet(s[i]) {
				return "", fmt.Errorf("character %q must be percent-encoded", s[i])
			}
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' {
			if i+2 >= len(s) || unhex(s[i+1]) < 0 || unhex(s[i+2]) < 0 {
				return "", fmt.Errorf("bad percent escape at offset %d", i)
			}
			b = append(b, byte(unhex(s[i+1])<<4|unhex(s[i+2])))
			i += 2
			continue
		}
		if !isBaggageOctet(c) {
			return "", fmt.Errorf("character %q must be percent-encoded", c)
		}
		b = append(b, c)
	}
	return string(b), nil
}

func percentEncode(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isBaggageOctet(c) && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0xf])
	}
	return b.String()
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
