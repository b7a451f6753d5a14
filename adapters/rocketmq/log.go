package rocketmq

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// The RocketMQ client logs through one process-wide logger (package rlog),
// by default logrus at INFO (ROCKETMQ_GO_LOG_LEVEL) to stdout, and it logs
// whole messages, bodies included, when a consume call fails. New leaves it
// alone: a library that replaced it behind a constructor would override a
// program's own choice (rlog.SetLogger, its logrus setup), and two Sources
// with different Config values would fight over one process-wide setting.
// SetClientLogger replaces it, on request, with a bridge into slog that
// drops everything below its level and replaces messages by their IDs.

// clientLog is where the bridge writes; nil logger means slog.Default().
type clientLog struct {
	logger *slog.Logger
	level  slog.Level
}

var (
	bridgeOnce sync.Once
	bridgeDest atomic.Pointer[clientLog]
)

// SetClientLogger sends the RocketMQ client library's logs at level and
// above to l (nil: slog.Default()), with every message in the client's log
// fields replaced by its ID, so that no body reaches the logs. Until it is
// called, the client logs as it does by itself: logrus, INFO and above
// (ROCKETMQ_GO_LOG_LEVEL), on stdout, bodies included.
//
// The client has one logger per process, so this is process-wide, unlike
// Config.Logger: call it once, at start-up, before the first Source or
// other client of the library starts (the client reads its logger without
// synchronisation). Later calls only change where the logs go and their
// level, and are safe at any time.
func SetClientLogger(l *slog.Logger, level slog.Level) {
	bridgeDest.Store(&clientLog{logger: l, level: level})
	installClientLogger()
}

// installClientLogger makes the bridge the client's logger, once.
func installClientLogger() {
	bridgeOnce.Do(func() { rlog.SetLogger(bridge{}) })
}

// bridge is an rlog.Logger writing to slog.
type bridge struct{}

var _ rlog.Logger = bridge{}

func (bridge) Debug(msg string, fields map[string]any)   { logClient(slog.LevelDebug, msg, fields) }
func (bridge) Info(msg string, fields map[string]any)    { logClient(slog.LevelInfo, msg, fields) }
func (bridge) Warning(msg string, fields map[string]any) { logClient(slog.LevelWarn, msg, fields) }
func (bridge) Error(msg string, fields map[string]any)   { logClient(slog.LevelError, msg, fields) }

// Fatal logs at error level. Unlike the client's default logger it does not
// exit the process.
func (bridge) Fatal(msg string, fields map[string]any) { logClient(slog.LevelError, msg, fields) }

// Level is rlog.SetLogLevel: "debug", "info", "warn", "error" or "fatal".
func (bridge) Level(level string) {
	lv := slog.LevelInfo
	switch strings.ToLower(level) {
	case "debug":
		lv = slog.LevelDebug
	case "warn", "warning":
		lv = slog.LevelWarn
	case "error", "fatal":
		lv = slog.LevelError
	}
	cur := bridgeDest.Load()
	bridgeDest.Store(&clientLog{logger: cur.logger, level: lv})
}

// OutputPath is ignored: the logs go to slog.
func (bridge) OutputPath(string) error { return nil }

func logClient(level slog.Level, msg string, fields map[string]any) {
	dest := bridgeDest.Load()
	if dest == nil || level < dest.level {
		return
	}
	l := dest.logger
	if l == nil {
		l = slog.Default()
	}
	ctx := context.Background()
	if !l.Enabled(ctx, level) {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+1)
	attrs = append(attrs, slog.String("component", "rocketmq-client"))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, redact(fields[k])))
	}
	l.LogAttrs(ctx, level, "rocketmq client: "+msg, attrs...)
}

// redact replaces messages (which carry bodies) by their IDs. The client
// passes messages as pointers and slices of pointers; other values hold no
// body.
func redact(v any) any {
	switch m := v.(type) {
	case *primitive.MessageExt:
		return msgSummary([]*primitive.MessageExt{m})
	case []*primitive.MessageExt:
		return msgSummary(m)
	case *primitive.Message:
		if m == nil {
			return "no message"
		}
		return "message to " + m.Topic
	case []*primitive.Message:
		return fmt.Sprintf("%d messages", len(m))
	}
	return v
}

func msgSummary(msgs []*primitive.MessageExt) string {
	const show = 8
	var b strings.Builder
	fmt.Fprintf(&b, "%d messages", len(msgs))
	for i, m := range msgs {
		if i == show {
			b.WriteString(" ...")
			break
		}
		if m == nil {
			continue
		}
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%s@%s/%d", sep, m.MsgId, m.Topic, m.QueueOffset)
	}
	return b.String()
}
