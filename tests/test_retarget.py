"""A restart under way pointed at a larger group: the launcher base's retarget, and the trainer service's."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from dagster import AssetKey, DagsterRunStatus, instance_for_test

from kale_dagster import build_definitions
from kale_dagster.definitions.decision import RETARGET_KEY, RescaleConfig
from kale_dagster.launchers.base import GroupLauncher
from kale_dagster.launchers.service import LauncherService, LocalTrainerClient
from support import decision_of, local_trainer_pipeline, produce_events, sensor_tick
from support import wait_for as _wait_for


class GatedLauncher(GroupLauncher):
    """Forms each group when the test opens the gate; gives up a forming group at a retarget, as the local
    launcher does at its waits (whose processes test_trainer.py exercises)."""

    def __init__(self, workers: int = 8, retargets: bool = True):
        super().__init__()
        self.retargets = retargets
        self.running, self.formed, self.abandoned = workers, [], []
        self.gate = threading.Event()
        self.forming = threading.Event()  # set while a group waits at the gate
        self.on_formed = lambda n: None

    @property
    def workers(self) -> int:
        return self.running

    @property
    def supports_retarget(self) -> bool:
        return self.retargets

    def _running_at(self, n: int) -> bool:
        return n == self.running

    def stop(self) -> None:
        self.running = 0

    def _replace_group(self, n: int) -> dict:
        self.running = 0
        self.forming.set()
        while not self.gate.is_set():
            if self.retarget_requested.wait(0.005):
                self.abandoned.append(n)
                self.forming.clear()
                self._check_retarget()
        self.forming.clear()
        self.running = n
        self.formed.append(n)
        self.on_formed(n)
        return {"start": 0.0}


def wait_for(predicate, timeout: float) -> None:
    _wait_for(predicate, timeout, "the launcher's state", poll_s=0.005)


def _rescaling(launcher: GroupLauncher, m: int) -> tuple[threading.Thread, list]:
    done: list = []
    thread = threading.Thread(target=lambda: done.append(launcher.rescale(m, reason="scale in")))
    thread.start()
    return thread, done


def test_a_retarget_gives_up_the_forming_group_and_records_one_restart():
    launcher = GatedLauncher(workers=8)
    thread, done = _rescaling(launcher, 4)
    wait_for(launcher.forming.is_set, timeout=5)
    status = launcher.status()
    assert (status.workers, status.rescaling, launcher.supports_retarget) == (4, True, True)
    time.sleep(0.02)
    assert launcher.retarget(19, reason="burst")
    assert launcher.status().workers == 19  # the new target is what the controller sees at once
    wait_for(lambda: launcher.abandoned == [4] and launcher.forming.is_set(), timeout=5)
    launcher.gate.set()
    thread.join(5)
    (record,) = done
    assert (record.from_workers, record.to_workers) == (8, 19)
    assert record.reason.startswith("scale in; retargeted to 19 after") and record.reason.endswith("burst")
    assert launcher.formed == [19]
    # The planner prices a restart from the retarget on: the abandoned part is not a restart's length.
    assert 0.02 <= record.phases["abandoned"] <= record.downtime_s
    assert launcher.status().downtimes_s == (pytest.approx(record.downtime_s - record.phases["abandoned"]),)
    assert not launcher.status().rescaling


@pytest.mark.parametrize(
    "case, rescaling, retargets, m, accepted",
    [
        ("a larger group, during a restart", True, True, 19, True),
        ("no larger than the restart's target", True, True, 4, False),
        ("fewer than the target: a scale-in waits for the restart", True, True, 2, False),
        ("no restart under way: a rescale's job", False, True, 19, False),
        ("a launcher that cannot give up a forming group", True, False, 19, False),
    ],
)
def test_when_a_retarget_is_accepted(case, rescaling, retargets, m, accepted):
    launcher = GatedLauncher(workers=8, retargets=retargets)
    thread = None
    if rescaling:
        thread, _ = _rescaling(launcher, 4)
        wait_for(launcher.forming.is_set, timeout=5)
    assert launcher.retarget(m) is accepted, case
    launcher.gate.set()
    if thread is not None:
        thread.join(5)
    assert launcher.running == (m if accepted else 4 if rescaling else 8), case


def test_a_retarget_accepted_as_the_group_forms_replaces_that_group():
    # The retarget lands after the group's last wait, before the restart has ended: not lost, a second replace.
    launcher = GatedLauncher(workers=8)
    launcher.gate.set()
    launcher.on_formed = lambda n: n == 4 and launcher.retarget(19, reason="burst")
    _, done = _rescaling(launcher, 4)
    wait_for(lambda: bool(done), timeout=5)
    assert launcher.formed == [4, 19] and done[0].to_workers == 19
    assert launcher.retarget(32) is False  # the restart has ended: a later burst is a rescale


def test_the_trainer_service_retargets_the_rescale_under_way():
    launcher = GatedLauncher(workers=8)
    service = LauncherService(launcher, port=0).start()
    try:
        client = LocalTrainerClient(service.url)
        assert client.retarget(19) is False  # nothing under way
        thread = threading.Thread(target=lambda: client.rescale(4, reason="scale in"))
        thread.start()
        wait_for(launcher.forming.is_set, timeout=5)
        assert client.retarget(19, reason="burst") is True  # answered at once, while the rescale's request waits
        status = client.status()
        assert (status.workers, status.rescaling, client.supports_retarget) == (19, True, True)
        launcher.gate.set()
        thread.join(5)
        assert client.workers == 19
    finally:
        service.close()


@pytest.mark.integration
@pytest.mark.parametrize("controlled", [{"policy": "static", "policy_options": {"workers": 3}}], indirect=True)
def test_the_sensor_decides_a_retarget_only_while_a_rescale_run_is_under_way(controlled):
    env, instance = controlled, controlled["instance"]
    env["workers"].restarting = True  # a restart to 2, which the launcher can redirect, without a run: a crash-restart
    produce_events(env["servers"], 40)
    first = sensor_tick(env)  # the first reading has no rate yet
    time.sleep(0.5)
    second = sensor_tick(env, first.cursor)
    assert decision_of(second).get(RETARGET_KEY) is None and decision_of(second)["action"] == "none"
    job = env["defs"].resolve_job_def("ctl_rescale")
    run_config = RescaleConfig(workers=2).as_run_config("ctl").to_config_dict()
    run = instance.create_run_for_job(job, run_config=run_config, status=DagsterRunStatus.STARTED)
    third = sensor_tick(env, second.cursor)
    decision = decision_of(third)
    assert decision[RETARGET_KEY] == 3 and decision["action"] == "retarget of the rescale under way to 3"
    assert not [r for r in third.run_requests if r.job_name == "ctl_rescale"]  # the run under way takes it
    assert env["workers"].workers == 3  # passed to the restart by the sensor, through the launcher
    instance.report_run_failed(run)


@pytest.mark.integration
def test_a_retarget_from_the_sensors_process_reaches_the_rescale_run_under_way(tmp_path):
    launcher = GatedLauncher(workers=8)
    service = LauncherService(launcher, port=0).start()
    p = local_trainer_pipeline(tmp_path, service.url)
    defs = build_definitions(p)
    key = AssetKey(["demo", "gpu_allocation"])
    try:
        with instance_for_test() as instance:
            results = []
            run_config = RescaleConfig(workers=4, reason="scale in").as_run_config("demo")
            rescale = threading.Thread(
                target=lambda: results.append(
                    defs.resolve_job_def("demo_rescale").execute_in_process(
                        run_config=run_config, instance=instance, raise_on_error=False
                    )
                )
            )
            rescale.start()
            wait_for(launcher.forming.is_set, timeout=30)
            # What the sensor's tick does with a burst that meets the restart (``PipelineControl._retarget``), through
            # a launcher of its own process, built as the sensor builds it.
            sensors_launcher = replace(p).launcher_instance
            assert sensors_launcher is not p.launcher_instance and sensors_launcher.retarget(19, reason="burst")
            wait_for(lambda: launcher.abandoned == [4], timeout=30)
            launcher.gate.set()
            rescale.join(30)
            assert not rescale.is_alive(), "the rescale run did not finish within 30 s of its launcher's return"
            assert results[0].success
            meta = instance.fetch_observations(key, limit=1).records[0].asset_observation.metadata
            assert (meta["workers"].value, meta["from_workers"].value) == (19, 8)
            assert "retargeted to 19" in meta["reason"].value and meta["reason"].value.endswith("burst")
    finally:
        service.close()
