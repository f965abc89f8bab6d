// Command imagetar assembles a container image from files on disk, without
// a Docker engine or a registry, and writes it as an image tarball that
// `docker load`, `podman load` and `ctr images import` all read.
//
//	imagetar -o fastpath.tar -t ghcr.io/fastpath-k8s/fastpath:dev \
//	    -user 65532:65532 -entrypoint /usr/bin/rdma-device-plugin \
//	    /usr/bin/rdma-device-plugin=bin/rdma-device-plugin /bin/sh-\>busybox …
//
// Each entry is DST=SRC (a file copied from SRC, executable if SRC is) or
// DST->TARGET (a symlink). Parent directories are made; everything is owned
// by root and dated at the epoch, so the same inputs give the same digest.
// `make image-tar` uses it to pack the Dockerfile's layout.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "imagetar:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("imagetar", flag.ContinueOnError)
	var spec Spec
	var labels, env stringList
	out := fs.String("o", "", "write the image tarball here")
	fs.StringVar(&spec.Ref, "t", "", "image reference it is tagged with (REGISTRY/NAME:TAG)")
	fs.StringVar(&spec.Arch, "arch", "amd64", "GOARCH of the binaries in it")
	fs.StringVar(&spec.User, "user", "", "user[:group] the container runs as")
	entrypoint := fs.String("entrypoint", "", "the container's entrypoint, one path")
	fs.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE environment variable (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || spec.Ref == "" {
		return errors.New("-o and -t are required")
	}
	if *entrypoint != "" {
		spec.Entrypoint = []string{*entrypoint}
	}
	spec.Env = env
	spec.Labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}
	for _, a := range fs.Args() {
		e, err := ParseEntry(a)
		if err != nil {
			return err
		}
		spec.Entries = append(spec.Entries, e)
	}
	digest, err := Write(*out, spec)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", *out, spec.Ref, digest)
	return nil
}
