# -*- coding: utf-8 -*-
# Copyright (c) gpuready.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The doctor's vocabulary: the links of the chain from the driver to a schedulable GPU pod, in the
order they are checked, every cause a check may find (the link it breaks, what it means, the fix),
and the exceptions a check raises. README.md ("Troubleshooting") lists the causes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

LINKS = ('driver', 'nvml', 'device_nodes', 'toolkit', 'containerd_config', 'containerd_runtime_loaded',
         'runtime_class', 'plugin_scheduled', 'plugin_running', 'kubelet_registration', 'capacity',
         'allocatable', 'labels', 'workload')
OK, BROKEN, NOT_CHECKED, NOT_APPLICABLE = 'ok', 'broken', 'not_checked', 'not_applicable'

# cause -> (link, what it means, the fix). Fixes name a command or a variable of this collection.
CAUSES = {
    'node_not_inspected': ('driver', 'the node evidence could not be read (unreachable host or failed module)',
                           'make the host reachable for Ansible (inventory, SSH, become) and run the doctor again'),
    'no_nvidia_gpu': ('driver', 'no NVIDIA PCI device (vendor 0x10de) on the node',
                      'check the inventory group: this host has no NVIDIA GPU'),
    'nouveau_loaded': ('driver', 'the nouveau driver owns the GPUs',
                       'blacklist nouveau in /etc/modprobe.d, rebuild the initramfs (update-initramfs -u) and reboot'),
    'nvidia_module_not_loaded': ('driver', 'the nvidia kernel module is not loaded',
                                 'modprobe nvidia; if it fails, install the headers for `uname -r` and rebuild the '
                                 'module (dkms autoinstall), or use signed/precompiled driver packages (Secure Boot)'),
    'pynvml_missing': ('nvml', 'the node\'s Python cannot import pynvml (nvidia-ml-py)',
                       'run playbooks/site.yml (role node_python) or install nvidia-ml-py for the interpreter'),
    'nvml_library_missing': ('nvml', 'libnvidia-ml.so.1 cannot be loaded: the driver\'s user-space part is missing',
                             'install the driver\'s utility/NVML package (libnvidia-ml) matching the kernel module'),
    'driver_library_version_mismatch': ('nvml', 'the loaded kernel module and the NVML library differ in version',
                                        'reboot (or unload and reload the nvidia modules); hold the driver packages '
                                        '(apt-mark hold / dnf versionlock) against unattended upgrades'),
    'nvml_init_failed': ('nvml', 'NVML does not initialise', 'read the NVML error; `nvidia-smi` on the node shows it'),
    'gpus_missing_from_nvml': ('nvml', 'NVML sees fewer GPUs than the PCI bus has',
                               'check `dmesg | grep -i xid` and `nvidia-smi -q`; reset or repair the missing GPU'),
    'device_nodes_missing': ('device_nodes', '/dev/nvidiactl or a /dev/nvidia<N> is missing',
                             'nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules'),
    'nvidia_uvm_missing': ('device_nodes', '/dev/nvidia-uvm is missing: nvidia_uvm not loaded',
                           'modprobe nvidia-uvm (add it to /etc/modules-load.d) or nvidia-modprobe -u -c=0'),
    'toolkit_not_installed': ('toolkit', 'the NVIDIA Container Toolkit is not installed',
                              'run playbooks/site.yml (role container_toolkit, gpuready_container_toolkit_version)'),
    'runtime_binary_missing': ('toolkit', 'the nvidia runtime\'s BinaryName is not an executable file',
                               'install nvidia-container-toolkit (role container_toolkit) or correct BinaryName'),
    'containerd_config_invalid': ('containerd_config', 'containerd\'s config file is not valid TOML',
                                  'fix the line the parser names; containerd refuses to start with it'),
    'cri_plugin_disabled': ('containerd_config', 'disabled_plugins switches the CRI plugin off',
                            'remove "cri" from disabled_plugins (containerd_nvidia_runtime refuses such a file)'),
    'nvidia_runtime_not_configured': ('containerd_config', 'containerd\'s config declares no nvidia runtime',
                                      'run playbooks/site.yml (role containerd_runtime) or '
                                      'nvidia-ctk runtime configure --runtime=containerd --set-as-default'),
    'runtime_in_wrong_table': ('containerd_config', 'the nvidia runtime is in a table this config version or '
                               'containerd does not read',
                               'containerd_nvidia_runtime writes the table of the file\'s version; version 2: '
                               'io.containerd.grpc.v1.cri, version 3: io.containerd.cri.v1.runtime'),
    'systemd_cgroup_mismatch': ('containerd_config', 'the nvidia runtime\'s SystemdCgroup disagrees with the '
                                'kubelet\'s cgroupDriver',
                                'containerd_nvidia_runtime with systemd_cgroup matching the kubelet (it reads '
                                '/var/lib/kubelet/config.yaml), then restart containerd'),
    'containerd_not_running': ('containerd_runtime_loaded', 'the containerd service is not active',
                               'systemctl start containerd; journalctl -u containerd says why it stopped'),
    'cri_unreachable': ('containerd_runtime_loaded', 'containerd runs but its CRI socket does not answer',
                        'check the socket path (k3s/RKE2: /run/k3s/containerd/containerd.sock) and '
                        'journalctl -u containerd'),
    'containerd_not_restarted': ('containerd_runtime_loaded', 'the config file says something the running '
                                 'containerd has not loaded',
                                 'systemctl restart containerd (the containerd_runtime role restarts it when needed)'),
    'runtime_not_loaded': ('containerd_runtime_loaded', 'the running containerd lacks the nvidia runtime its config '
                           'declares, and the file is older than the service: another config or instance',
                           'check `containerd config dump`, the imports, and which containerd the kubelet uses'),
    'default_runtime_not_nvidia': ('runtime_class', 'runc is containerd\'s default and the device plugin has no '
                                   'runtimeClassName, so it gets no driver',
                                   'gpuready_set_as_default: true (nvidia-ctk ... --set-as-default), or false, '
                                   'which deploys RuntimeClass nvidia and sets runtimeClassName'),
    'runtime_class_missing': ('runtime_class', 'the device plugin names a RuntimeClass that does not exist',
                              'create it (role device_plugin with gpuready_set_as_default: false)'),
    'runtime_class_handler_unknown': ('runtime_class', 'the RuntimeClass handler is not a runtime of the running '
                                      'containerd', 'set handler: nvidia, or configure that runtime in containerd'),
    'node_not_registered': ('plugin_scheduled', 'no Node of that name in the API: the kubelet has not registered it, '
                            'or gpuready_node_name is not the Node name',
                            'set gpuready_node_name (or k8s_node_name) to the name `kubectl get nodes` shows'),
    'device_plugin_not_deployed': ('plugin_scheduled', 'no NVIDIA device plugin DaemonSet in the cluster',
                                   'run playbooks/site.yml (role device_plugin)'),
    'two_device_plugins': ('plugin_scheduled', 'two NVIDIA device plugins target the node: they fight over '
                           'kubelet registration', 'keep one: remove the other DaemonSet (the device_plugin role '
                           'refuses to deploy beside a foreign one unless device_plugin_existing: replace)'),
    'plugin_affinity_no_match': ('plugin_scheduled', 'the device plugin\'s nodeSelector/affinity does not match the '
                                 'node\'s labels', 'label the node nvidia.com/gpu.present=true (role '
                                 'node_labels) or deploy NFD so feature.node.kubernetes.io/pci-10de.present is set'),
    'taint_not_tolerated': ('plugin_scheduled', 'the node has a taint the device plugin does not tolerate',
                            'add a toleration (device_plugin_tolerations) or remove the taint'),
    'plugin_pod_not_created': ('plugin_scheduled', 'the DaemonSet targets the node but has no pod there',
                               'read the DaemonSet events (PodSecurity: label the namespace '
                               'pod-security.kubernetes.io/enforce=privileged)'),
    'plugin_image_pull_failed': ('plugin_running', 'the device plugin image cannot be pulled',
                                 'gpuready_registry for a mirror, or import the image on air-gapped nodes'),
    'runtime_handler_not_configured': ('plugin_running', 'the pod sandbox names a runtime handler containerd does '
                                       'not have', 'configure the runtime and restart containerd'),
    'plugin_nvml_load_failed': ('plugin_running', 'the device plugin cannot load NVML inside its container',
                                'make nvidia containerd\'s default runtime or give the plugin its RuntimeClass, '
                                'then delete the plugin pod'),
    'plugin_crashing': ('plugin_running', 'the device plugin container keeps exiting',
                        'read its log (kubectl logs --previous)'),
    'plugin_not_ready': ('plugin_running', 'the device plugin pod is not ready', 'read its log and events'),
    'kubelet_socket_missing': ('kubelet_registration', 'no kubelet.sock in the device-plugins folder the plugin '
                               'uses: the kubelet root dir differs',
                               'mount the kubelet\'s real <root-dir>/device-plugins into the plugin'),
    'plugin_not_registered': ('kubelet_registration', 'the device plugin serves no socket in the kubelet\'s '
                              'device-plugins folder and the kubelet holds none of its devices',
                              'delete the device plugin pod so it registers again'),
    'no_gpu_capacity': ('kubelet_registration', 'the node advertises no nvidia.com resource',
                        'read the device plugin log for its registration with the kubelet'),
    'sharing_renamed_resource': ('capacity', 'sharing renames the resource (renameByDefault), so nvidia.com/gpu '
                                 'is not what the node advertises',
                                 'request the .shared resource, or gpuready_sharing.rename_by_default: false'),
    'mig_strategy_mismatch': ('capacity', 'the MIG resources do not match gpuready_mig_strategy',
                              'use one migStrategy for the plugin and GFD (gpuready_mig_strategy)'),
    'capacity_mismatch': ('capacity', 'the node advertises a different number of GPUs than its GPUs give',
                          'check sharing replicas (gpuready_sharing) and GPU health'),
    'gpus_unhealthy': ('allocatable', 'allocatable is below capacity: the plugin marked GPUs unhealthy, or it '
                       'stopped', 'look for Xid errors (dmesg | grep -i xid); drain and reset or repair the GPU'),
    'gfd_not_deployed': ('labels', 'no GPU Feature Discovery: the node has no nvidia.com/gpu.* labels',
                         'run playbooks/site.yml (role feature_discovery) or label nodes (role node_labels)'),
    'nfd_not_deployed': ('labels', 'GFD runs but no NFD master turns its features into labels',
                         'deploy NFD (feature_discovery_deploy_nfd: true)'),
    'gpu_labels_missing': ('labels', 'GFD and NFD run but the node lacks nvidia.com/gpu.product',
                           'read the GFD pod log on the node'),
    'gpu_labels_stale': ('labels', 'nvidia.com/gpu.count or mig.strategy disagrees with the GPUs or settings',
                         'restart GFD on the node; one gpuready_mig_strategy for the plugin and GFD'),
    'gpu_request_unschedulable': ('workload', 'a pod requesting GPUs cannot be scheduled',
                                  'request no more than a node\'s allocatable GPUs, free GPUs, or check selectors'),
    'workload_failed': ('workload', 'a pod requesting GPUs failed on the node',
                        'read the pod\'s log and events'),
    'test_pod_failed': ('workload', 'the doctor\'s test pod did not run nvidia-smi', 'read the evidence'),
}


class Finding(Exception):
    """A broken link: raised by a check, so the first one stops the chain."""

    def __init__(self, cause, evidence, fix=None):
        super(Finding, self).__init__(cause)
        self.cause = cause
        self.evidence = [evidence] if isinstance(evidence, str) else list(evidence)
        self.fix = fix or CAUSES[cause][2]


class NotApplicable(Exception):
    """The link does not apply to this node (runtime_class when nvidia is containerd's default)."""
