package webhook

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func noCert(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return nil, errors.New("no certificate in this test")
}
