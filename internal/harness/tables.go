package harness

import (
	"io"
	"strings"

	"github.com/jedib0t/go-pretty/v6/table"
	"github.com/jedib0t/go-pretty/v6/text"
)

// tableStyle is the plain look of the human tables on stdout: aligned
// columns separated by two spaces, the header as written (lower case, as
// the JSON fields), no borders, so that they read well in a terminal and
// paste into docs unchanged.
var tableStyle = func() table.Style {
	s := table.StyleDefault
	s.Name = "hams"
	s.Box.PaddingLeft, s.Box.PaddingRight = "", ""
	s.Box.MiddleVertical = "  "
	s.Options = table.Options{SeparateColumns: true}
	s.Format.Header = text.FormatDefault
	s.Format.HeaderAlign = text.AlignDefault
	return s
}()

// NewTable is a table with the header, rendered by render(w). The first
// left columns are aligned left (names), the others right (numbers).
func NewTable(left int, header ...any) table.Writer {
	align := strings.Repeat("l", left) + strings.Repeat("r", max(len(header)-left, 0))
	return NewTableAlign(align, header...)
}

// NewTableAlign is a table whose columns are aligned as align says, one
// letter per column: l (left) or r (right).
func NewTableAlign(align string, header ...any) table.Writer {
	t := table.NewWriter()
	t.SetStyle(tableStyle)
	t.AppendHeader(table.Row(header))
	var cc []table.ColumnConfig
	for i := range header {
		a := text.AlignLeft
		if i < len(align) && align[i] == 'r' {
			a = text.AlignRight
		}
		cc = append(cc, table.ColumnConfig{Number: i + 1, Align: a, AlignHeader: a})
	}
	t.SetColumnConfigs(cc)
	return t
}

// Render writes t to w, each line indented by indent.
func Render(w io.Writer, t table.Writer, indent string) {
	lines := strings.Split(t.Render(), "\n")
	for _, l := range lines {
		io.WriteString(w, indent+l+"\n")
	}
}
