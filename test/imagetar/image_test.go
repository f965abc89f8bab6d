package main

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/stretchr/testify/require"
)

func TestParseEntry(t *testing.T) {
	for in, want := range map[string]Entry{
		"/usr/bin/sriov=bin/sriov": {Path: "/usr/bin/sriov", Source: "bin/sriov"},
		"/bin/sh->busybox":         {Path: "/bin/sh", Link: "busybox"},
	} {
		got, err := ParseEntry(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"usr/bin/x=y", "/usr/../x=y", "/=y", "/x=", "/x->", "/x"} {
		_, err := ParseEntry(bad)
		require.Error(t, err, bad)
	}
}

// layerFiles reads back the image's single layer: path -> header.
func layerFiles(t *testing.T, file string) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	img, err := tarball.ImageFromPath(file, nil)
	require.NoError(t, err)
	layers, err := img.Layers()
	require.NoError(t, err)
	require.Len(t, layers, 1)
	rc, err := layers[0].Uncompressed()
	require.NoError(t, err)
	defer rc.Close()
	hdrs, data := map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		hdrs[h.Name] = h
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		data[h.Name] = string(b)
	}
	return hdrs, data
}

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "plugin")
	require.NoError(t, os.WriteFile(bin, []byte("#!binary"), 0o700))
	ids := filepath.Join(dir, "pci.ids")
	require.NoError(t, os.WriteFile(ids, []byte("15b3  Mellanox\n"), 0o600))
	spec := Spec{
		Ref: "localhost/test/img:1", Arch: "arm64", User: "65532:65532",
		Entrypoint: []string{"/usr/bin/plugin"}, Env: []string{"PATH=/usr/bin:/bin"},
		Labels: map[string]string{"org.opencontainers.image.version": "v1"},
		Entries: []Entry{
			{Path: "/usr/bin/plugin", Source: bin},
			{Path: "/usr/share/misc/pci.ids", Source: ids},
			{Path: "/bin/sh", Link: "busybox"},
		},
	}
	out := filepath.Join(dir, "img.tar")
	d1, err := Write(out, spec)
	require.NoError(t, err)

	img, err := tarball.ImageFromPath(out, nil)
	require.NoError(t, err)
	cf, err := img.ConfigFile()
	require.NoError(t, err)
	require.Equal(t, "linux", cf.OS)
	require.Equal(t, "arm64", cf.Architecture)
	require.Equal(t, "65532:65532", cf.Config.User)
	require.Equal(t, []string{"/usr/bin/plugin"}, cf.Config.Entrypoint)
	require.Equal(t, spec.Env, cf.Config.Env)
	require.Equal(t, spec.Labels, cf.Config.Labels)
	// The tarball format keeps no manifest (a reader makes one up); the
	// image it was written from is OCI.
	built, err := Image(spec)
	require.NoError(t, err)
	mt, err := built.MediaType()
	require.NoError(t, err)
	require.Equal(t, types.OCIManifestSchema1, mt)

	// The tag is in the tarball's manifest, where docker load and ctr find it.
	tag, err := name.NewTag(spec.Ref)
	require.NoError(t, err)
	_, err = tarball.ImageFromPath(out, &tag)
	require.NoError(t, err)

	hdrs, data := layerFiles(t, out)
	require.Equal(t, int64(0o755), hdrs["usr/bin/plugin"].Mode, "executable source: 0755")
	require.Equal(t, int64(0o644), hdrs["usr/share/misc/pci.ids"].Mode)
	require.Equal(t, "#!binary", data["usr/bin/plugin"])
	require.Equal(t, byte(tar.TypeSymlink), hdrs["bin/sh"].Typeflag)
	require.Equal(t, "busybox", hdrs["bin/sh"].Linkname)
	for _, d := range []string{"usr/", "usr/bin/", "usr/share/", "usr/share/misc/", "bin/"} {
		require.Contains(t, hdrs, d)
		require.Equal(t, byte(tar.TypeDir), hdrs[d].Typeflag, d)
	}
	for n, h := range hdrs {
		require.Zero(t, h.Uid, n)
		require.Zero(t, h.ModTime.Unix(), n)
	}

	// Same inputs, same digest.
	d2, err := Write(filepath.Join(dir, "again.tar"), spec)
	require.NoError(t, err)
	require.Equal(t, d1, d2)
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(f, nil, 0o644))
	for name, spec := range map[string]Spec{
		"bad ref":        {Ref: "UPPER/case:1", Entries: []Entry{{Path: "/f", Source: f}}},
		"missing source": {Ref: "x/y:1", Entries: []Entry{{Path: "/f", Source: filepath.Join(dir, "nope")}}},
		"dir source":     {Ref: "x/y:1", Entries: []Entry{{Path: "/f", Source: dir}}},
		"twice":          {Ref: "x/y:1", Entries: []Entry{{Path: "/f", Source: f}, {Path: "/f", Link: "g"}}},
		"file and dir":   {Ref: "x/y:1", Entries: []Entry{{Path: "/a", Source: f}, {Path: "/a/b", Source: f}}},
	} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, "out.tar")
			_, err := Write(out, spec)
			require.Error(t, err)
			require.NoFileExists(t, out)
		})
	}
}
