// Copyright (c) gpuready.nvidia contributors
// GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

// kubelet-device-manager runs the real kubelet's device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager,
// at the version the lab pins) and nothing else of the kubelet: the device plugin Registration service on
// /var/lib/kubelet/device-plugins/kubelet.sock, the connection to each registered plugin, and the device
// lists it keeps from their ListAndWatch streams. Whenever what the kubelet would put into its Node's
// capacity and allocatable (GetCapacity, the call of the kubelet's node status update) changes, it writes
// them to stdout as one JSON line: {"capacity": {resource: count}, "allocatable": {resource: count}}.
// The tests run a real device plugin against it where a whole node would be too much (one per GFD case).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
)

// allSourcesReady: no pod sources here, so nothing to wait for.
type allSourcesReady struct{}

func (allSourcesReady) AddSource(string) {}
func (allSourcesReady) AllReady() bool  { return true }

func counts(list v1.ResourceList) map[string]int64 {
	out := map[string]int64{}
	for name, quantity := range list {
		out[string(name)] = quantity.Value()
	}
	return out
}

func main() {
	logger := klog.Background()
	manager, err := devicemanager.NewManagerImpl(logger, nil, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-device-manager:", err)
		os.Exit(1)
	}
	noPods := func() []*v1.Pod { return nil }
	if err := manager.Start(logger, noPods, allSourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-device-manager:", err)
		os.Exit(1)
	}
	// The manager tells the kubelet of device changes for pods that hold them; there are none, but a
	// full channel would block it.
	go func() {
		for range manager.Updates() {
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	encoder := json.NewEncoder(os.Stdout)
	last := ""
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			_ = manager.Stop(logger)
			return
		case <-tick.C:
			capacity, allocatable, _ := manager.GetCapacity(logger)
			state := map[string]map[string]int64{"capacity": counts(capacity), "allocatable": counts(allocatable)}
			key := fmt.Sprint(state)
			if key != last {
				last = key
				if err := encoder.Encode(state); err != nil {
					os.Exit(1)
				}
			}
		}
	}
}
