package attempt

import (
	"log/slog"

	"github.com/idemflow/idemflow/internal/keytable"
)

func slogKey(f keytable.Fence) slog.Attr {
	return slog.Group("key", slog.String("scope", f.Scope), slog.String("key", f.Key), slog.String("id", f.ID))
}
