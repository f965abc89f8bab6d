package docscheck

import (
	"path"
	"regexp"
	"strings"
)

// Commands are the binaries whose flags the docs are checked against, and
// each one's subcommands (a subcommand has --help output of its own).
var Commands = map[string][]string{
	"rdma-device-plugin":     {"discover", "doctor", "install-cni", "provision", "serve", "uninstall"},
	"rdma-device-plugin-dra": {"discover", "doctor", "install-cni", "provision", "serve", "uninstall"},
	"sriov":                  nil,
}

// binaryAlias maps an invocation's base name to its entry in Commands:
// the CNI's package is sriov-cni, installed as sriov.
var binaryAlias = map[string]string{"sriov-cni": "sriov"}

var (
	makeRE    = regexp.MustCompile(`(?:^|[\s;&|(])make((?:\s+[A-Za-z0-9_.=/-]+)+)`)
	targetRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)
	flagRE    = regexp.MustCompile(`^--?([A-Za-z][A-Za-z0-9-]*)(?:=.*)?$`)
	envRE     = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	helpRE    = regexp.MustCompile(`(?m)^\s+--?([A-Za-z][A-Za-z0-9-]*)(?:\s|$)`)
	mkRuleRE  = regexp.MustCompile(`^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*::?(?:[^=]|$)`)
	separator = map[string]bool{"&&": true, "||": true, ";": true, "|": true, "--": true, "$(": true}
)

// MakeTargets are the targets text runs make with: the words after "make"
// up to the first one that is not a target name (a comment, a pipe);
// variable assignments (BENCH=x) and options are passed over.
func MakeTargets(text string) []string {
	var out []string
	for _, m := range makeRE.FindAllStringSubmatch(text, -1) {
		for _, w := range strings.Fields(m[1]) {
			if strings.Contains(w, "=") || strings.HasPrefix(w, "-") {
				continue
			}
			if !targetRE.MatchString(w) {
				break
			}
			out = append(out, w)
		}
	}
	return out
}

// FlagUse is one flag a command line gives a command; Command is "" for a
// code span that is a flag alone (`--host-root /host`).
type FlagUse struct {
	Command string // "rdma-device-plugin doctor"
	Flag    string // without dashes
}

// FlagUses finds the flags a command line gives the Commands. The line is
// cut into commands at &&, ||, ;, | and a lone -- (kubectl exec … --
// rdma-device-plugin doctor). A command counts when, after sudo, env,
// time and VAR=value words, its first word is one of the Commands (by
// base name: bin/rdma-device-plugin, /opt/cni/bin/sriov) or it is
// "go run ./cmd/NAME"; a subcommand may follow. Its flags are the words
// that look like -name or --name[=value] (brackets of a usage synopsis
// taken off), up to a comment or a redirection. Any other command's flags
// (go build -tags, udevadm --action) are not looked at. With bare, a code
// span that starts with --name is that flag without a command (Command "").
func FlagUses(text string, bare bool) []FlagUse {
	words := strings.Fields(text)
	if bare && len(words) > 0 && strings.HasPrefix(words[0], "--") {
		if m := flagRE.FindStringSubmatch(words[0]); m != nil {
			return []FlagUse{{Flag: m[1]}}
		}
	}
	var out []FlagUse
	for len(words) > 0 {
		end := 0
		for end < len(words) && !separator[words[end]] && !strings.HasPrefix(words[end], "#") {
			end++
		}
		out = append(out, commandFlags(words[:end])...)
		if end < len(words) && strings.HasPrefix(words[end], "#") {
			break
		}
		if end == len(words) {
			break
		}
		words = words[end+1:]
	}
	return out
}

// commandFlags: the flags of one command (words without separators).
func commandFlags(words []string) []FlagUse {
	for len(words) > 0 && (words[0] == "sudo" || words[0] == "env" || words[0] == "time" || envRE.MatchString(words[0])) {
		words = words[1:]
	}
	if len(words) == 0 {
		return nil
	}
	var bin string
	if words[0] == "go" && len(words) > 2 && words[1] == "run" && strings.HasPrefix(words[2], "./cmd/") {
		bin, words = command(words[2]), words[3:]
	} else {
		bin, words = command(strings.Trim(words[0], "[]")), words[1:]
	}
	if bin == "" {
		return nil
	}
	cmd := bin
	if len(words) > 0 {
		for _, sub := range Commands[bin] {
			if words[0] == sub {
				cmd, words = bin+" "+sub, words[1:]
				break
			}
		}
	}
	var out []FlagUse
	for _, w := range words {
		if strings.HasPrefix(w, ">") || strings.HasPrefix(w, "<") || strings.HasPrefix(w, "2>") {
			break
		}
		w = strings.Trim(w, "[]")
		if m := flagRE.FindStringSubmatch(w); m != nil {
			out = append(out, FlagUse{cmd, m[1]})
		}
	}
	return out
}

// command is the Commands entry a program path names, or "".
func command(p string) string {
	base := path.Base(p)
	if a, ok := binaryAlias[base]; ok {
		base = a
	}
	if _, ok := Commands[base]; ok {
		return base
	}
	return ""
}

// cmdLine is a command line of a code block, at an offset from its first
// line.
type cmdLine struct {
	line int
	text string
}

// commandLines joins a code block's lines into command lines: a line
// ending in a backslash goes on in the next one, and so does a usage
// synopsis' indented line of [--options].
func commandLines(lines []string) []cmdLine {
	var out []cmdLine
	cont := false
	for i, l := range lines {
		t := strings.TrimSpace(l)
		join := cont || (len(out) > 0 && strings.HasPrefix(t, "[") && l != t)
		cont = strings.HasSuffix(t, "\\")
		t = strings.TrimSuffix(t, "\\")
		if join {
			out[len(out)-1].text += " " + t
			continue
		}
		out = append(out, cmdLine{i, t})
	}
	return out
}

// ParseHelp is the set of flag names a Go flag package --help lists.
func ParseHelp(help string) map[string]bool {
	out := map[string]bool{}
	for _, m := range helpRE.FindAllStringSubmatch(help, -1) {
		out[m[1]] = true
	}
	return out
}

// ParseMakefile is the set of targets a Makefile defines (rules; not
// variables, not .PHONY and other special targets).
func ParseMakefile(makefile string) map[string]bool {
	out := map[string]bool{}
	for _, l := range strings.Split(makefile, "\n") {
		if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "#") {
			continue
		}
		m := mkRuleRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		for _, t := range strings.Fields(m[1]) {
			if !strings.HasPrefix(t, ".") {
				out[t] = true
			}
		}
	}
	return out
}
