package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec is what goes into the image.
type Spec struct {
	Ref        string // REGISTRY/NAME:TAG
	Arch       string // GOARCH
	User       string
	Entrypoint []string
	Env        []string
	Labels     map[string]string
	Entries    []Entry
}

// Entry is one file or symlink of the image's single layer.
type Entry struct {
	Path   string // absolute path in the image
	Source string // file on disk; "" for a symlink
	Link   string // symlink target
}

// ParseEntry reads DST=SRC or DST->TARGET.
func ParseEntry(s string) (Entry, error) {
	var e Entry
	if dst, target, ok := strings.Cut(s, "->"); ok {
		e = Entry{Path: dst, Link: target}
	} else if dst, src, ok := strings.Cut(s, "="); ok {
		e = Entry{Path: dst, Source: src}
	} else {
		return e, fmt.Errorf("entry %q: want DST=SRC or DST->TARGET", s)
	}
	if !path.IsAbs(e.Path) || path.Clean(e.Path) != e.Path || e.Path == "/" {
		return e, fmt.Errorf("entry %q: %q is not a clean absolute path", s, e.Path)
	}
	if e.Source == "" && e.Link == "" {
		return e, fmt.Errorf("entry %q: empty source", s)
	}
	return e, nil
}

// epoch dates every file and the image itself: the same inputs give the
// same digest.
var epoch = time.Unix(0, 0).UTC()

// layerTar writes the entries as one uncompressed tar, parent directories
// first, in path order.
func layerTar(entries []Entry) ([]byte, error) {
	seen := map[string]bool{}
	var dirs []string
	for _, e := range entries {
		if seen[e.Path] {
			return nil, fmt.Errorf("%s: listed twice", e.Path)
		}
		seen[e.Path] = true
		for d := path.Dir(e.Path); d != "/"; d = path.Dir(d) {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
	}
	for _, d := range dirs {
		if slices.ContainsFunc(entries, func(e Entry) bool { return e.Path == d }) {
			return nil, fmt.Errorf("%s: a file and a directory", d)
		}
	}
	slices.Sort(dirs)
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b Entry) int { return strings.Compare(a.Path, b.Path) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	for _, d := range dirs {
		if err := hdr(&tar.Header{Typeflag: tar.TypeDir, Name: d[1:] + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, e := range sorted {
		if e.Link != "" {
			if err := hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: e.Path[1:], Linkname: e.Link, Mode: 0o777}); err != nil {
				return nil, err
			}
			continue
		}
		if err := addFile(tw, hdr, e); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func addFile(tw *tar.Writer, hdr func(*tar.Header) error, e Entry) error {
	f, err := os.Open(e.Source)
	if err != nil {
		return fmt.Errorf("%s: %w", e.Path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", e.Path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s: source %s is not a regular file", e.Path, e.Source)
	}
	mode := int64(0o644)
	if st.Mode()&0o111 != 0 {
		mode = 0o755
	}
	if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: e.Path[1:], Mode: mode, Size: st.Size()}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, f); err != nil {
		return fmt.Errorf("%s: copy %s: %w", e.Path, e.Source, err)
	}
	return nil
}

// Image builds the OCI image the spec describes: one layer, linux/Arch.
func Image(spec Spec) (v1.Image, error) {
	layerBytes, err := layerTar(spec.Entries)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "imagetar", Comment: fmt.Sprintf("%d entries", len(spec.Entries))},
	})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", spec.Arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = spec.User
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Env = spec.Env
	cf.Config.Labels = spec.Labels
	return mutate.ConfigFile(img, cf)
}

// Write builds the image and writes it to out as an image tarball tagged
// spec.Ref; it returns the manifest digest.
func Write(out string, spec Spec) (string, error) {
	ref, err := name.NewTag(spec.Ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", spec.Ref, err)
	}
	img, err := Image(spec)
	if err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		os.Remove(tmp)
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return d.String(), nil
}
