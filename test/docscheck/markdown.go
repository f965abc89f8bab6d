package docscheck

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// SkipMarker, alone on the last non-blank line before a fenced code block,
// exempts that block from every check: for an example that is partial or
// wrong on purpose.
const SkipMarker = "<!-- docscheck: skip -->"

// A flags marker, <!-- docscheck: flags CMD[, CMD…] --> on a line of its
// own anywhere in a page, says which commands (Commands, with a subcommand
// where it has one: "rdma-device-plugin doctor") the page's code spans
// that are a double-dash flag alone (`--host-root /host`) belong to; each
// must be a flag of one of them. Without it such spans are not checked: a
// page may name another program's flags (the kubelet's --root-dir) the
// same way.
var flagsMarkerRE = regexp.MustCompile(`^<!--\s*docscheck:\s*flags\s+(.+?)\s*-->$`)

// doc is what the checks read of one Markdown file.
type doc struct {
	blocks   []block
	spans    []span // inline code spans, outside code blocks
	links    []link
	headings []string // heading texts, in order
	// flagScope is what the page's flags marker names; marker its line.
	flagScope []string
	marker    int
	anchors   map[string]bool
	problems  []Problem // of the file's own structure (a stray marker)
}

// block is a fenced code block.
type block struct {
	lang string
	line int // of its first content line
	text []string
	skip bool
}

type span struct {
	text string // whitespace collapsed to single spaces
	line int
}

type link struct {
	target string
	line   int
}

var (
	fenceRE   = regexp.MustCompile("^ {0,3}(```+|~~~+)\\s*([^`\\s]*)")
	headingRE = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$`)
	// [text](target) and ![alt](target); the text may span lines.
	linkRE   = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	htmlIDRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	spaceRE  = regexp.MustCompile(`\s+`)
)

// parse splits a Markdown file into what the checks need: fenced code
// blocks, and, outside them, headings, inline code spans and links (the
// links with code spans taken out first, so that `[x](y)` in code is not a
// link).
func parse(file, text string) *doc {
	d := &doc{anchors: map[string]bool{}}
	lines := strings.Split(text, "\n")
	var para []string // the current paragraph's lines
	paraStart := 0
	flush := func() {
		if len(para) > 0 {
			d.inline(strings.Join(para, "\n"), paraStart)
		}
		para = nil
	}
	lastNonBlank := ""
	markerPending := 0 // line of a skip marker not yet followed by a block
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := fenceRE.FindStringSubmatch(l); m != nil {
			flush()
			fence := m[1]
			b := block{lang: strings.ToLower(m[2]), line: i + 2}
			b.skip = strings.TrimSpace(lastNonBlank) == SkipMarker
			if b.skip {
				markerPending = 0
			}
			for i++; i < len(lines); i++ {
				t := strings.TrimLeft(lines[i], " ")
				if strings.HasPrefix(t, fence) && strings.Trim(t, fence[:1]+" \t") == "" {
					break
				}
				b.text = append(b.text, lines[i])
			}
			d.blocks = append(d.blocks, b)
			lastNonBlank = ""
			continue
		}
		if m := flagsMarkerRE.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			if d.marker != 0 {
				d.problems = append(d.problems, Problem{file, i + 1, "a second flags marker (the first is on line " + strconv.Itoa(d.marker) + ")"})
			}
			d.marker = i + 1
			for _, c := range strings.Split(m[1], ",") {
				d.flagScope = append(d.flagScope, strings.TrimSpace(c))
			}
		}
		if strings.TrimSpace(l) == SkipMarker {
			if markerPending != 0 {
				d.problems = append(d.problems, Problem{file, markerPending, SkipMarker + " is not followed by a code block"})
			}
			markerPending = i + 1
		}
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		if markerPending != 0 && markerPending != i+1 {
			// Prose between the marker and the next block.
			d.problems = append(d.problems, Problem{file, markerPending, SkipMarker + " is not followed by a code block"})
			markerPending = 0
		}
		lastNonBlank = l
		if m := headingRE.FindStringSubmatch(l); m != nil {
			flush()
			d.headings = append(d.headings, m[1])
			d.inline(m[1], i+1)
			continue
		}
		if len(para) == 0 {
			paraStart = i + 1
		}
		para = append(para, l)
	}
	flush()
	if markerPending != 0 {
		d.problems = append(d.problems, Problem{file, markerPending, SkipMarker + " is not followed by a code block"})
	}
	seen := map[string]int{}
	for _, h := range d.headings {
		s := Slug(h)
		if n := seen[s]; n > 0 {
			d.anchors[s+"-"+strconv.Itoa(n)] = true
		} else {
			d.anchors[s] = true
		}
		seen[s]++
	}
	for _, m := range htmlIDRE.FindAllStringSubmatch(text, -1) {
		d.anchors[m[1]] = true
	}
	return d
}

// inline collects the code spans and links of a paragraph (or heading)
// that starts at line.
func (d *doc) inline(text string, line int) {
	lineAt := func(off int) int { return line + strings.Count(text[:off], "\n") }
	masked := []byte(text)
	for _, sp := range codeSpans(text) {
		body := strings.TrimSpace(spaceRE.ReplaceAllString(text[sp[0]+sp[2]:sp[1]-sp[2]], " "))
		d.spans = append(d.spans, span{body, lineAt(sp[0])})
		for k := sp[0]; k < sp[1]; k++ {
			if masked[k] != '\n' {
				masked[k] = ' '
			}
		}
	}
	for _, m := range linkRE.FindAllStringSubmatchIndex(string(masked), -1) {
		d.links = append(d.links, link{string(masked[m[2]:m[3]]), lineAt(m[0])})
	}
}

// codeSpans finds CommonMark code spans: a run of n backticks up to the
// next run of exactly n. Each is {start, end, n}; a run without its
// closing one is text.
func codeSpans(text string) [][3]int {
	var out [][3]int
	run := func(i int) int {
		j := i
		for j < len(text) && text[j] == '`' {
			j++
		}
		return j - i
	}
	for i := 0; i < len(text); {
		if text[i] != '`' {
			i++
			continue
		}
		n := run(i)
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := run(j)
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		out = append(out, [3]int{i, end, n})
		i = end
	}
	return out
}

// Slug is the anchor GitHub gives a heading: its text without Markdown
// (code backticks, emphasis, link targets), lower-cased, every character
// that is not a letter, digit, mark, '_', '-' or space dropped, and each
// space turned into '-'. A second heading with the same slug gets "-1",
// the third "-2" (parse does that).
func Slug(heading string) string {
	t := linkRE.ReplaceAllStringFunc(heading, func(s string) string {
		return s[strings.Index(s, "[")+1 : strings.Index(s, "]")]
	})
	var b strings.Builder
	for _, r := range strings.ToLower(t) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '_' || r == '-' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
