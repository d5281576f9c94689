// stargz-snapshotter: containerd's remote snapshotter for lazily pulled eStargz layers, as a process of its own
// (what upstream ships as containerd-stargz-grpc), built by scripts/stargz-snapshotter from the library Debian
// packages (golang-github-containerd-stargz-snapshotter-dev 0.12.0), which ships no such program. It serves the
// snapshots API on a unix socket that containerd names as a proxy plugin. Registry credentials come from the
// docker config (dockerconfig keychain); layer metadata is kept in memory.
package main

import (
	"context"
	"flag"
	"net"
	"os"
	"os/signal"
	"path/filepath"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/contrib/snapshotservice"
	"github.com/containerd/containerd/log"
	"github.com/containerd/stargz-snapshotter/fs"
	memorymetadata "github.com/containerd/stargz-snapshotter/metadata/memory"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/containerd/stargz-snapshotter/service/keychain/dockerconfig"
	"github.com/containerd/stargz-snapshotter/service/resolver"
	"github.com/pelletier/go-toml"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

func main() {
	address := flag.String("address", "/run/stargz-snapshotter/stargz.sock", "the snapshots API's unix socket")
	root := flag.String("root", "/var/lib/stargz-snapshotter", "where layers are mounted and cached")
	configPath := flag.String("config", "", "a TOML file of service.Config (e.g. [[resolver.host.\"HOST\".mirrors]])")
	flag.Parse()
	ctx := context.Background()

	var config service.Config
	if *configPath != "" {
		tree, err := toml.LoadFile(*configPath)
		if err != nil {
			log.G(ctx).WithError(err).Fatal("reading the configuration")
		}
		if err := tree.Unmarshal(&config); err != nil {
			log.G(ctx).WithError(err).Fatal("the configuration is not a stargz service.Config")
		}
	}
	if err := service.Supported(*root); err != nil {
		log.G(ctx).WithError(err).Fatal("this host cannot run the snapshotter (FUSE, overlayfs)")
	}
	keychain := []resolver.Credential{dockerconfig.NewDockerconfigKeychain(ctx)}
	fsOpts := []fs.Option{fs.WithMetadataStore(memorymetadata.NewReader)}
	snapshotter, err := service.NewStargzSnapshotterService(ctx, *root, &config,
		service.WithCredsFuncs(keychain...), service.WithFilesystemOptions(fsOpts...))
	if err != nil {
		log.G(ctx).WithError(err).Fatal("starting the snapshotter")
	}
	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(snapshotter))
	if err := os.MkdirAll(filepath.Dir(*address), 0o700); err != nil {
		log.G(ctx).WithError(err).Fatal("the socket's directory")
	}
	_ = os.Remove(*address)
	listener, err := net.Listen("unix", *address)
	if err != nil {
		log.G(ctx).WithError(err).Fatal("listening")
	}
	go func() {
		if err := rpc.Serve(listener); err != nil {
			log.G(ctx).WithError(err).Fatal("serving")
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, unix.SIGINT, unix.SIGTERM)
	<-stop
	rpc.Stop()
	// its FUSE mounts are unmounted and its cache kept for the next start (SIGTERM), or removed (SIGINT)
	if err := snapshotter.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("closing the snapshotter")
	}
}
