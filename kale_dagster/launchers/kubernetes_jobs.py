"""A namespace's Jobs and their pods, through dagster-k8s's client: the calls and waits a Kubernetes restart is
made of (create, delete and wait for the pods to go, give up a forming Job, read pods), with no decisions in them.

The decisions (which size, what to restore, what capacity was found) are ``launchers.kubernetes``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kale_dagster.launchers.base import RescaleFailed
from kale_dagster.launchers.pods import stepped


class NamespacedJobs:
    """One namespace's Jobs through a ``DagsterKubernetesClient``, polling every ``poll_s`` on ``clock``."""

    def __init__(
        self, client: Any, namespace: str, clock: Callable[[], float], sleeper: Callable[[float], None], poll_s: float
    ):
        self.client, self.namespace = client, namespace
        self.batch_api, self.core_api = client.batch_api, client.core_api
        self.clock, self.sleeper, self.poll_s = clock, sleeper, poll_s

    def newest(self, selector: str) -> Any | None:
        """The newest Job matching ``selector`` that is not being deleted."""
        jobs = self.batch_api.list_namespaced_job(self.namespace, label_selector=selector).items
        live = [j for j in jobs if not j.metadata.deletion_timestamp]
        return max(live, key=lambda j: j.metadata.creation_timestamp or 0) if live else None

    def pods(self, name: str) -> list:
        return self.client.get_pods_in_job(name, self.namespace)

    def namespace_pods(self) -> list:
        return self.core_api.list_namespaced_pod(self.namespace).items

    def read(self, name: str) -> Any:
        return self.batch_api.read_namespaced_job(name, self.namespace)

    def create(self, job: dict) -> None:
        self.batch_api.create_namespaced_job(self.namespace, job)

    def annotate(self, name: str, annotations: dict) -> None:
        """Merge ``annotations`` into the Job's (a value of None removes one)."""
        self.batch_api.patch_namespaced_job(name, self.namespace, {"metadata": {"annotations": annotations}})

    def ensure_service(self, service: dict) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core_api.read_namespaced_service(service["metadata"]["name"], self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core_api.create_namespaced_service(self.namespace, service)

    def delete_and_wait(self, name: str, timeout_s: float) -> None:
        """Delete the Job and its pods (each stops over its grace period: it checkpoints); raise ``TimeoutError``
        if pods are still there after ``timeout_s``."""
        self.client.delete_job(name, self.namespace)
        if not self.pods_gone(name, timeout_s):
            raise TimeoutError(f"pods of job {name} still terminating after {timeout_s:.0f} s")

    def remove(self, name: str, timeout_s: float) -> None:
        """``delete_and_wait`` for a Job that may already be gone."""
        from kubernetes.client.rest import ApiException

        try:
            self.delete_and_wait(name, timeout_s)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def pods_gone(self, name: str, timeout_s: float) -> bool:
        """Wait until the Job's pods are gone; whether they went within ``timeout_s``."""
        deadline = self.clock() + timeout_s
        while self.pods(name):
            if self.clock() > deadline:
                return False
            self.sleeper(self.poll_s)
        return True

    def abandon(self, name: str, timeout_s: float) -> None:
        """Delete a Job still forming, its pods without a grace period: before their first step they have trained
        nothing, written no checkpoint and committed no offset, and a graceful stop would wait out their restore."""
        from kubernetes.client.rest import ApiException

        pods = [pod.metadata.name for pod in self.pods(name)]
        for delete, target in [(self.batch_api.delete_namespaced_job, name)] + [
            (self.core_api.delete_namespaced_pod, pod) for pod in pods
        ]:
            try:
                delete(target, self.namespace, grace_period_seconds=0, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise
        # Deleted without grace: a pod still there past the timeout is the kubelet's to reap, no failure.
        self.pods_gone(name, timeout_s)

    def wait_first_step(self, name: str, timeout_s: float, on_poll: Callable[[], None]) -> None:
        """Until every pod's log shows the worker's first step (the local launcher waits for the same event),
        calling ``on_poll`` at each poll."""
        deadline = self.clock() + timeout_s
        pending = {pod.metadata.name for pod in self.pods(name)}
        while pending:
            pending = {pod for pod in pending if not stepped(self.client.retrieve_pod_logs(pod, self.namespace))}
            if not pending:
                return
            if self.clock() > deadline:
                raise TimeoutError(
                    f"{len(pending)} pods of job {name} ready but no training step after {timeout_s:.0f} s"
                )
            on_poll()
            self.sleeper(self.poll_s)

    def check_shared_claim(self, name: str) -> None:
        """Every worker pod mounts the checkpoint claim, on whichever node it lands: it must be ReadWriteMany."""
        from kubernetes.client.rest import ApiException

        ns = self.namespace
        try:
            claim = self.core_api.read_namespaced_persistent_volume_claim(name, ns)
        except ApiException as exc:
            raise RescaleFailed(
                f"cannot read the checkpoint PersistentVolumeClaim {name!r} in namespace {ns!r} (API error "
                f"{exc.status} {exc.reason}); create it ReadWriteMany, and grant get on persistentvolumeclaims "
                "(docs/kubernetes/rbac.yaml)",
                None,
            ) from exc
        modes = list(getattr(claim.spec, "access_modes", None) or [])
        if "ReadWriteMany" not in modes:
            raise RescaleFailed(
                f"the checkpoint PersistentVolumeClaim {name!r} is {'/'.join(modes) or 'without access modes'}; "
                "workers on several nodes share it, so it must be ReadWriteMany (e.g. NFS, CephFS, EFS, Filestore)",
                None,
            )
