package harness

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
)

// LoadBar draws the status line of a load run until done: a bar over the
// run's duration, the time elapsed of the total, and figures() (replies,
// errors, percentiles so far). It redraws every 250 ms on a terminal and
// every second otherwise (a log file gets one line per second).
func LoadBar(w io.Writer, total time.Duration, done <-chan struct{}, figures func() string) {
	every := time.Second
	if isTerminal(w) {
		every = 250 * time.Millisecond
	}
	bar := progressbar.NewOptions64(max(total.Milliseconds(), 1),
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(24),
		progressbar.OptionSetTheme(progressbar.Theme{Saucer: "#", SaucerPadding: ".", BarStart: "[", BarEnd: "]"}),
		progressbar.OptionShowDescriptionAtLineEnd(),
		progressbar.OptionSetRenderBlankState(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionThrottle(0),
	)
	start := time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	draw := func() {
		el := time.Since(start)
		bar.Describe(fmt.Sprintf("%5.1fs/%v  %s", el.Seconds(), total, figures()))
		_ = bar.Set64(min(el, total).Milliseconds())
	}
	for {
		select {
		case <-t.C:
			draw()
		case <-done:
			draw()
			_ = bar.Exit()
			fmt.Fprintln(w)
			return
		}
	}
}

// isTerminal says whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
