package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// ratio is one benchmark's figure against its floor's.
type ratio struct {
	pkg, name, floor string
	measure          string  // the unit compared; "" when the row names none
	ours, theirs     string  // the two figures, formatted
	x                float64 // ours / theirs, as the benchmark measured it
	goal             float64 // 0: none
}

// ratios are the rows' x-<floor> units, in row order and, within a row,
// in floor name order.
func ratios(rows []row) []ratio {
	var out []ratio
	for _, r := range rows {
		var floors []string
		for u := range r.nums {
			if f, ok := strings.CutPrefix(u, "x-"); ok && f != "" {
				floors = append(floors, f)
			}
		}
		sort.Strings(floors)
		for _, f := range floors {
			rt := ratio{pkg: r.pkg, name: r.name, floor: f, x: r.nums["x-"+f], goal: r.nums["goal-x-"+f]}
			// The measure is the unit u that the row has beside
			// <floor>-u; the first in name order if several.
			var measures []string
			for u := range r.values {
				if m, ok := strings.CutPrefix(u, f+"-"); ok && r.values[m] != "" {
					measures = append(measures, m)
				}
			}
			sort.Strings(measures)
			if len(measures) > 0 {
				rt.measure, rt.ours, rt.theirs = measures[0], r.values[measures[0]], r.values[f+"-"+measures[0]]
			}
			out = append(out, rt)
		}
	}
	return out
}

// writeRatios prints the ratio table, if any row has a ratio.
func writeRatios(out io.Writer, rows []row) {
	rs := ratios(rows)
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(out, "\nAgainst this machine's floor, measured in the same run:\n\n")
	fmt.Fprintf(out, "| package | benchmark | measure | fastpath | floor | ratio | goal | met |\n")
	fmt.Fprintf(out, "|---|---|---|---:|---:|---:|---:|---|\n")
	for _, r := range rs {
		measure, ours, theirs := r.measure, r.ours, r.theirs
		if measure == "" {
			measure, ours, theirs = "–", "–", "–"
		}
		goal, met := "–", "–"
		if r.goal > 0 {
			goal = "≤ " + strconv.FormatFloat(r.goal, 'f', 2, 64) + "×"
			met = map[bool]string{true: "yes", false: "no"}[r.x <= r.goal]
		}
		fmt.Fprintf(out, "| %s | %s | %s | %s | %s (%s) | %s× | %s | %s |\n", shortPkg(r.pkg), r.name, measure, ours, theirs, r.floor,
			strconv.FormatFloat(r.x, 'f', 3, 64), goal, met)
	}
}
