"""The Pod Security Standards' "restricted" profile (which includes "baseline"), checked on a pod spec.

Follows https://kubernetes.io/docs/concepts/security/pod-security-standards/ control by control, for
Kubernetes 1.30-1.37 (the versions the chart supports). `violations()` returns one line per failed
control, naming the field; an empty list means the pod is admitted under `enforce: restricted`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

BASELINE_CAPABILITIES = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                         "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}
VOLUME_NON_SOURCE_KEYS = {"name"}
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"


def _containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for c in pod.get(kind) or []:
            yield f"spec.{kind}[{c.get('name')}]", c


def _baseline(pod: Mapping[str, Any], annotations: Mapping[str, str]) -> Iterator[str]:
    psc = pod.get("securityContext") or {}
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        yield "HostProcess: spec.securityContext.windowsOptions.hostProcess"
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            yield f"Host Namespaces: spec.{field}"
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            yield f"HostPath Volumes: spec.volumes[{volume.get('name')}].hostPath"
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"HostProcess: {where}.securityContext.windowsOptions.hostProcess"
        if sc.get("privileged"):
            yield f"Privileged Containers: {where}.securityContext.privileged"
        added = set(((sc.get("capabilities") or {}).get("add")) or []) - BASELINE_CAPABILITIES
        if added:
            yield f"Capabilities: {where} adds {sorted(added)}"
        for port in c.get("ports") or []:
            if port.get("hostPort"):
                yield f"Host Ports: {where}.ports[].hostPort {port['hostPort']}"
        if sc.get("procMount") not in (None, "Default"):
            yield f"/proc Mount Type: {where}.securityContext.procMount {sc['procMount']}"
    for where, sc in [("spec.securityContext", psc)] + [(f"{w}.securityContext", c.get("securityContext") or {})
                                                          for w, c in _containers(pod)]:
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            yield f"AppArmor: {where}.appArmorProfile.type {apparmor}"
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES:
            yield f"SELinux: {where}.seLinuxOptions.type {selinux['type']}"
        for field in ("user", "role"):
            if selinux.get(field):
                yield f"SELinux: {where}.seLinuxOptions.{field}"
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined":
            yield f"Seccomp: {where}.seccompProfile.type Unconfined"
    for key, value in annotations.items():
        if key.startswith(APPARMOR_ANNOTATION) and value != "runtime/default" and not value.startswith("localhost/"):
            yield f"AppArmor: annotation {key}={value}"
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"Sysctls: spec.securityContext.sysctls {sysctl.get('name')}"


def _restricted(pod: Mapping[str, Any]) -> Iterator[str]:
    psc = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - VOLUME_NON_SOURCE_KEYS
        if not kinds <= RESTRICTED_VOLUMES:
            yield f"Volume Types: spec.volumes[{volume.get('name')}] is {sorted(kinds - RESTRICTED_VOLUMES)}"
    pod_non_root = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    if psc.get("runAsUser") == 0:
        yield "Running as Non-root user: spec.securityContext.runAsUser 0"
    for where, c in _containers(pod):
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"Privilege Escalation: {where}.securityContext.allowPrivilegeEscalation must be false"
        non_root = sc.get("runAsNonRoot")
        if non_root is False or (non_root is None and not pod_non_root):
            yield f"Running as Non-root: {where}.securityContext.runAsNonRoot must be true (here or for the pod)"
        if sc.get("runAsUser") == 0:
            yield f"Running as Non-root user: {where}.securityContext.runAsUser 0"
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost") and not (seccomp is None and pod_seccomp):
            yield f"Seccomp: {where}.securityContext.seccompProfile.type must be RuntimeDefault or Localhost"
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            yield f"Capabilities: {where}.securityContext.capabilities.drop must include ALL"
        added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
        if added:
            yield f"Capabilities: {where} adds {sorted(added)} (restricted allows NET_BIND_SERVICE only)"


def violations(pod_spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None) -> list[str]:
    return [*_baseline(pod_spec, annotations or {}), *_restricted(pod_spec)]
