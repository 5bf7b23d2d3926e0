package hbone

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Authority is the target of a CONNECT request: the `:authority` pseudo-header
// (RFC 9113 §8.5). HBONE peers send either an IP address and port, with IPv6 in
// brackets, or a DNS name and port (double HBONE through a gateway).
type Authority struct {
	// Addr is the target IP when the authority names one; invalid otherwise.
	Addr netip.Addr
	// Host is the DNS name when the authority names one; empty otherwise.
	Host string
	// Port is the target port, never zero.
	Port uint16
}

// maxAuthorityLen bounds the input; a DNS name is at most 253 bytes.
const maxAuthorityLen = 253 + len(":65535") + len("[]")

// ParseAuthority parses a CONNECT target of the form ip:port, [ipv6]:port or
// hostname:port. It rejects userinfo, paths, zones, empty parts and ports
// outside 1..65535, saying which.
func ParseAuthority(s string) (Authority, error) {
	if s == "" {
		return Authority{}, errors.New("empty :authority, want host:port")
	}
	if len(s) > maxAuthorityLen {
		return Authority{}, fmt.Errorf(":authority is %d bytes, longer than the %d a host:port can be", len(s), maxAuthorityLen)
	}
	host, portStr, err := splitHostPort(s)
	if err != nil {
		return Authority{}, fmt.Errorf(":authority %q: %w", s, err)
	}
	port, err := parsePort(portStr)
	if err != nil {
		return Authority{}, fmt.Errorf(":authority %q: %w", s, err)
	}
	if strings.HasPrefix(s, "[") {
		addr, err := netip.ParseAddr(host)
		if err != nil || !addr.Is6() || addr.Zone() != "" || addr.Is4In6() {
			return Authority{}, fmt.Errorf(":authority %q: %q in brackets is not a plain IPv6 address", s, host)
		}
		return Authority{Addr: addr, Port: port}, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if !addr.Is4() {
			return Authority{}, fmt.Errorf(":authority %q: IPv6 addresses must be in brackets", s)
		}
		return Authority{Addr: addr, Port: port}, nil
	}
	if err := checkHostname(host); err != nil {
		return Authority{}, fmt.Errorf(":authority %q: %w", s, err)
	}
	return Authority{Host: strings.ToLower(host), Port: port}, nil
}

// AuthorityFrom returns the authority of an IP target.
func AuthorityFrom(ap netip.AddrPort) Authority {
	return Authority{Addr: ap.Addr().Unmap(), Port: ap.Port()}
}

// IsIP reports whether the authority names an IP address.
func (a Authority) IsIP() bool { return a.Addr.IsValid() }

// AddrPort returns the IP target; it is invalid when the authority is a name.
func (a Authority) AddrPort() netip.AddrPort {
	if !a.Addr.IsValid() {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a.Addr, a.Port)
}

// String formats the authority as it goes on the wire.
func (a Authority) String() string {
	if a.Addr.IsValid() {
		return netip.AddrPortFrom(a.Addr, a.Port).String()
	}
	return a.Host + ":" + strconv.Itoa(int(a.Port))
}

func splitHostPort(s string) (host, port string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", errors.New("missing ] after the IPv6 address")
		}
		host, rest := s[1:end], s[end+1:]
		if !strings.HasPrefix(rest, ":") {
			return "", "", errors.New("missing :port after the IPv6 address")
		}
		return host, rest[1:], nil
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", "", errors.New("missing :port")
	}
	host, port = s[:i], s[i+1:]
	if host == "" {
		return "", "", errors.New("missing host before :port")
	}
	if strings.Contains(host, ":") {
		return "", "", errors.New("IPv6 addresses must be in brackets")
	}
	return host, port, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" {
		return 0, errors.New("empty port")
	}
	if len(s) > 5 {
		return 0, fmt.Errorf("port %q is not a number in 1..65535", s)
	}
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port %q is not a number in 1..65535", s)
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q is not a number in 1..65535", s)
	}
	return uint16(n), nil
}

// checkHostname accepts RFC 1123 host names: dot-separated labels of letters,
// digits and hyphens, each 1..63 bytes, not starting or ending with a hyphen.
func checkHostname(h string) error {
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return errors.New("empty host name")
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("host name label %q must be 1 to 63 bytes", label)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host name label %q must not start or end with a hyphen", label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host name %q has the character %q, want letters, digits, '-' and '.'", h, c)
			}
		}
	}
	return nil
}
