package idemflowui

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
)

// Host check. A page that a browser loads from another site can rebind its own name to
// the address this handler listens on (DNS rebinding) and read the answers as its own,
// since the browser takes them for the same origin; the request then carries the other
// site's name in its Host header. So the handler answers only Host headers that no
// other site can own: the name localhost, an IP literal equal to the address the
// request came in on (net/http's LocalAddrContextKey), and the names in Options.Hosts.
// Names under .localhost are not answered unless listed: browsers resolve them to
// loopback themselves, but other resolvers may ask DNS. The port of localhost, of an IP
// literal and of a name listed without one is not checked (a tunnel or a proxy may
// change it), and checking it would not stop a rebound name, which can use any port.

// AnyHost, as an entry of Options.Hosts, turns the Host check off.
const AnyHost = "*"

// checkHosts lowercases the entries of Options.Hosts and refuses malformed ones.
func checkHosts(hosts []string) ([]string, error) {
	out := make([]string, len(hosts))
	for i, host := range hosts {
		h := strings.ToLower(host)
		if h == "" || strings.ContainsAny(h, "/ \t\r\n@?#") {
			return nil, fmt.Errorf("idemflowui: host %q: want a name or name:port as a browser sends it, such as ops.example.com or ops.example.com:8081", host)
		}
		out[i] = h
	}
	return out, nil
}

// hostAllowed says whether the handler answers a request with r's Host header.
func (h *Handler) hostAllowed(r *http.Request) bool {
	host := strings.ToLower(r.Host)
	if slices.Contains(h.opts.Hosts, AnyHost) || slices.Contains(h.opts.Hosts, host) {
		return true
	}
	name, _, err := net.SplitHostPort(host)
	if err != nil { // no port
		name = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	if name == "localhost" || slices.Contains(h.opts.Hosts, name) {
		return true
	}
	ip, err := netip.ParseAddr(name)
	if err != nil || ip.Zone() != "" {
		return false
	}
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	ap, err := netip.ParseAddrPort(local.String())
	return err == nil && ap.Addr().Unmap() == ip.Unmap()
}
