// Package hbone implements HBONE, the tunnel of Istio's ambient mode: each
// proxied TCP connection is one HTTP/2 CONNECT stream (RFC 9113 §8.5), many
// streams share one mutual-TLS connection to port 15008, and the peers
// prove SPIFFE identities with their certificates.
//
// The HTTP/2 engine is built on golang.org/x/net/http2's Framer and hpack,
// tuned for tunnels rather than requests:
//
//   - Windows of 4 MiB per stream and 16 MiB per connection, 1 MiB frames
//     accepted, keepalive PINGs every 10 s with a 20 s timeout, at most 100
//     streams per pooled client connection and 200 per server connection
//     (the values ztunnel uses).
//   - DATA payloads are read from TLS straight into pooled per-stream chunks
//     and, when a Stream is being copied to a socket with WriteTo or
//     StartWriteTo, written to that socket by the reading goroutine without
//     a hand-off; StartWriteTo holds no goroutine of its own until the
//     socket does not take a write at once or the stream ends. Send buffers
//     start at 1 KiB and grow with the traffic. An idle stream holds no
//     buffer.
//   - One goroutine reads each connection and never blocks on a write;
//     control frames it must send (SETTINGS and PING acks, WINDOW_UPDATE,
//     RST_STREAM) go through a bounded queue served by a second goroutine.
//   - Writes are coalesced: frames of all streams go to one pending buffer
//     and one writer at a time writes it, with what the others added
//     meanwhile; a stream's DATA write yields once first when other streams
//     are open and the connection wrote within the last 100 µs, so that
//     answers ready at about the same time share a TLS record and a
//     write(2). crypto/tls writes each record with a write(2)
//     of its own; the socket under it gathers the records of one large
//     write (up to two 64 KiB frames) into one.
//
// Server answers CONNECTs (400 for protocol violations, the handler's
// status otherwise) and hands each accepted tunnel to its caller as a
// Stream, a net.Conn. Dialer opens tunnels over a pool keyed by source
// identity, acceptable peer identities, next hop and source IP
// (as ztunnel keys its pool). A Stream's ReadFrom, StartReadFrom and
// StartWriteTo are the zero-copy paths package relay takes to relay a
// tunnel and a TCP connection; a handler that relays with them detaches
// its stream (Request.Detach) and returns.
//
// Abuse is bounded: header blocks (64 KiB server, 16 KiB client, with
// CONTINUATION floods cut off by the framer), concurrent handlers per
// connection (a stream's slot is held until its handler returns or is done
// with the detached stream, so a rapid-reset flood cannot start unbounded
// work, and a peer that resets streams before they are answered faster
// than they complete gets GOAWAY ENHANCE_YOUR_CALM), the control-frame
// queue, and every frame but DATA.
package hbone
