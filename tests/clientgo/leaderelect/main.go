// leaderelect: a client-go leader election (resourcelock.LeaseLock) on one coordination.k8s.io/v1
// Lease object, for the interop tests of actix-coordination (tests/clientgo.rs).
//
// Built by scripts/test-cluster.sh install from the client-go vendored in the Kubernetes source the
// kube-apiserver is built from (GOPATH mode, under cmd/leaderelect/ of the unpacked tree).
//
// stdout carries one line per event, flushed at once, and nothing else:
//
//	ready                  the elector is set up and runs (printed once, before anything else)
//	started-leading        OnStartedLeading
//	stopped-leading        OnStoppedLeading (client-go calls it when Run returns, also if it never led)
//	new-leader <identity>  OnNewLeader (including our own identity)
//
// SIGTERM (or SIGINT) cancels the context: with ReleaseOnCancel the lease is released (empty
// holderIdentity, leaseDurationSeconds 1) if held, then the program exits 0. client-go's own logs
// (klog) go to stderr. The bearer token is read from -token-file or the environment variable named
// by -token-env; it is never printed.
package main

import (
	"context"
	"flag"
	"fmt"
	"io/ioutil"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

var outMu sync.Mutex

// emit writes one event line to stdout (unbuffered: os.Stdout is written through at once).
func emit(line string) {
	outMu.Lock()
	defer outMu.Unlock()
	if _, err := os.Stdout.Write([]byte(line + "\n")); err != nil {
		fmt.Fprintf(os.Stderr, "leaderelect: stdout: %v\n", err)
	}
}

func fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "leaderelect: "+format+"\n", args...)
	os.Exit(2)
}

func main() {
	server := flag.String("server", "", "API server URL, https://HOST:PORT (required)")
	caFile := flag.String("ca-file", "", "PEM file of the CA to trust for the API server (required)")
	tokenFile := flag.String("token-file", "", "file holding the bearer token")
	tokenEnv := flag.String("token-env", "", "name of the environment variable holding the bearer token")
	namespace := flag.String("namespace", "default", "namespace of the Lease object")
	name := flag.String("name", "", "name of the Lease object (required)")
	identity := flag.String("identity", "", "holder identity of this candidate (required)")
	leaseDuration := flag.Duration("lease-duration", 15*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 10*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 2*time.Second, "RetryPeriod")
	flag.Parse()

	if *server == "" || *caFile == "" || *name == "" || *identity == "" {
		fatalf("-server, -ca-file, -name and -identity are required")
	}
	var token string
	switch {
	case *tokenFile != "" && *tokenEnv != "":
		fatalf("give -token-file or -token-env, not both")
	case *tokenFile != "":
		b, err := ioutil.ReadFile(*tokenFile)
		if err != nil {
			fatalf("read token file %s: %v", *tokenFile, err)
		}
		token = strings.TrimSpace(string(b))
	case *tokenEnv != "":
		token = strings.TrimSpace(os.Getenv(*tokenEnv))
	}
	if token == "" {
		fatalf("no bearer token (-token-file or -token-env)")
	}

	config := &rest.Config{
		Host:            *server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: *caFile},
		Timeout:         *renewDeadline,
	}
	client, err := coordinationv1.NewForConfig(config)
	if err != nil {
		fatalf("client: %v", err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: *name, Namespace: *namespace},
		Client:     client,
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}

	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-signals
		fmt.Fprintf(os.Stderr, "leaderelect: %v: cancelling (releases the lease if held)\n", sig)
		cancel()
	}()

	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { emit("started-leading") },
			OnStoppedLeading: func() { emit("stopped-leading") },
			OnNewLeader:      func(id string) { emit("new-leader " + id) },
		},
	})
	if err != nil {
		fatalf("leader elector: %v", err)
	}
	emit("ready")
	// Returns when ctx is cancelled (after the release) or when the lease is lost.
	elector.Run(ctx)
	fmt.Fprintln(os.Stderr, "leaderelect: elector stopped")
}
