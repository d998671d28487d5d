"""The shared conformance suite (clients/conformance/scenarios.json), run by
the blocking client and by the asyncio one. The Rust and Node.js clients
run the same file; a client that differs fails."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import threading
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio as aredis
from redis.exceptions import ResponseError

import redis_lock_client as sync_api
import redis_lock_client.asyncio as async_api
from conftest import Server

SCENARIOS = json.loads(
    (Path(__file__).resolve().parents[2] / "conformance" / "scenarios.json").read_text()
)["scenarios"]

ERRORS = {
    "NotHeld": sync_api.NotHeld,
    "StaleFence": sync_api.StaleFence,
    "ModuleMissing": sync_api.ModuleMissing,
    "ServerError": ResponseError,
}


#: An observer's next item did not come in time (``"expect": "nothing"``).
NOTHING = object()


class Failed:
    """An observer's stream ended with this error."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def reply_of(value):
    """A reply as the scenarios write it: statuses and strings as text."""
    if isinstance(value, bytes):
        return value.decode()
    if value is True:
        return "OK"
    return value


def error_name(e: BaseException) -> str:
    for name, kind in ERRORS.items():
        if isinstance(e, kind):
            return name
    return type(e).__name__


class Checks:
    """The steps every runner judges the same way."""

    def __init__(self, server: Server, scenario: dict) -> None:
        self.server = server
        self.raw = redis.Redis(port=server.port)
        self.name = scenario["name"]
        self.leases: dict = {}

    def where(self, i, step):
        return f"{self.name}, step {i} {step}"

    def raw_command(self, i, step):
        got = self.raw.execute_command(*step["command"])
        if "expect_fence_of" in step:
            assert got == self.leases[step["expect_fence_of"]].fence, self.where(i, step)
        else:
            assert reply_of(got) == step["expect"], self.where(i, step)

    def common(self, i, step) -> bool:
        """Steps with nothing to await; False if not one."""
        do = step["do"]
        if do == "sleep_ms":
            time.sleep(step["ms"] / 1000)
        elif do == "server":
            self.raw_command(i, step)
        elif do == "server_info":
            assert self.server.info(step["field"]) == step["expect"], self.where(i, step)
        elif do == "fence_order":
            assert self.leases[step["later"]].fence > self.leases[step["earlier"]].fence
        elif do == "same_fence":
            assert self.leases[step["a"]].fence == self.leases[step["b"]].fence
        elif do == "expect_valid":
            assert self.leases[step["lease"]].is_valid() == step["valid"], self.where(i, step)
        else:
            return False
        return True

    def judge_acquire(self, i, step, lease, error):
        if "expect_error" in step:
            assert error is not None, self.where(i, step)
            assert error_name(error) == step["expect_error"], f"{self.where(i, step)}: {error!r}"
            return
        if error is not None:
            raise error
        if step["expect"] == "granted":
            assert lease is not None, self.where(i, step)
            self.leases[step["as"]] = lease
        else:
            assert lease is None, self.where(i, step)

    def judge_leader(self, i, step, got):
        """A leader read or observed: a Leader, or None for vacant."""
        if isinstance(got, Failed):
            raise got.error
        expect = step["expect"]
        want = None if expect == "vacant" else (self.leases[expect["fence_of"]].fence,
                                                 expect["value"])
        have = None if got is None else (got.fence, reply_of(got.value))
        assert have == want, f"{self.where(i, step)}: got {got!r}"

    def judge_observed(self, i, step, got):
        if step["expect"] == "nothing":
            assert got is NOTHING, f"{self.where(i, step)}: got {got!r}"
            return
        assert got is not NOTHING, f"{self.where(i, step)}: nothing came"
        self.judge_leader(i, step, got)

    def judge_proclaim(self, i, step, error):
        if "expect_error" in step:
            assert error is not None and error_name(error) == step["expect_error"], \
                f"{self.where(i, step)}: {error!r}"
        elif error is not None:
            raise error

    def judge_reply(self, i, step, got, error):
        if "expect_error" in step:
            assert error is not None and error_name(error) == step["expect_error"], \
                f"{self.where(i, step)}: {error!r}"
        else:
            if error is not None:
                raise error
            assert reply_of(got) == step["expect"], self.where(i, step)


def campaign_args(step):
    return dict(ttl=step["ttl_ms"] / 1000, timeout=step.get("timeout_ms", 0) / 1000)


def acquire_args(step, leases):
    kwargs = dict(ttl=step["ttl_ms"] / 1000, timeout=step.get("timeout_ms", 0) / 1000,
                  shared=step.get("shared", False), limit=step.get("limit"))
    if "token_of" in step:
        kwargs["token"] = leases[step["token_of"]].token
    return kwargs


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_sync(scenario):
    server = Server(with_module=scenario.get("server") != "plain")
    try:
        run_sync(server, scenario)
    finally:
        server.stop()


def run_sync(server, scenario):
    checks = Checks(server, scenario)
    client = redis.Redis(port=server.port)
    plain = {"renew": sync_api.Locks(client, renew=True), "still": sync_api.Locks(client, renew=False)}
    observers: dict = {}
    campaigns: dict = {}
    try:
        run_sync_steps(server, scenario, checks, client, plain, observers, campaigns)
    finally:
        for observer, _, pump in observers.values():
            observer.close()
            pump.join(5)
        # While the server is up: a lease left renewing would try its
        # stopped server later from the one renewal thread of the process
        # (each try ~4 s of redis-py's retries), late for other tests' leases.
        for lease in checks.leases.values():
            try:
                lease.release()
            except Exception:  # noqa: BLE001
                pass
        for locks in plain.values():
            locks.close()
        client.close()


def campaign_sync(locks, step):
    """A campaign's outcome as an acquire's: (lease or None, error)."""
    try:
        return locks.campaign(step["key"], step["value"], **campaign_args(step)), None
    except sync_api.NotAcquired:
        return None, None
    except Exception as e:  # noqa: BLE001
        return None, e


def run_sync_steps(server, scenario, checks, client, plain, observers, campaigns):
    for i, step in enumerate(scenario["steps"]):
        if checks.common(i, step):
            continue
        do = step["do"]
        if do == "campaign":
            locks = plain["renew" if step.get("renew", True) else "still"]
            if step.get("background"):
                out: dict = {}
                t = threading.Thread(target=lambda: out.update(result=campaign_sync(locks, step)),
                                     daemon=True)
                t.start()
                campaigns[step["as"]] = (t, out)
            else:
                checks.judge_acquire(i, step, *campaign_sync(locks, step))
        elif do == "campaigned":
            t, out = campaigns.pop(step["as"])
            t.join(step["within_ms"] / 1000)
            assert not t.is_alive(), f"{checks.where(i, step)}: the campaign did not end in time"
            checks.judge_acquire(i, step, *out["result"])
        elif do == "proclaim":
            error = None
            try:
                checks.leases[step["as"]].proclaim(step["value"])
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_proclaim(i, step, error)
        elif do == "leader":
            checks.judge_leader(i, step, plain["renew"].leader(step["key"]))
        elif do == "observe":
            observer = plain["renew"].observe(step["key"])
            items: queue.Queue = queue.Queue()

            def pump(observer=observer, items=items):
                try:
                    for item in observer:
                        items.put(item)
                except Exception as e:  # noqa: BLE001
                    items.put(Failed(e))

            t = threading.Thread(target=pump, daemon=True)
            t.start()
            observers[step["as"]] = (observer, items, t)
        elif do == "observed":
            _, items, _ = observers[step["as"]]
            try:
                got = items.get(timeout=step["within_ms"] / 1000)
            except queue.Empty:
                got = NOTHING
            checks.judge_observed(i, step, got)
        elif do == "acquire":
            locks = plain["renew" if step.get("renew", True) else "still"]
            lease = error = None
            try:
                kwargs = acquire_args(step, checks.leases)
                if "keys" in step:
                    lease = locks.acquire_all(step["keys"], **kwargs)
                else:
                    lease = locks.acquire(step["key"], **kwargs)
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_acquire(i, step, lease, error)
        elif do == "release":
            assert checks.leases[step["lease"]].release() == step["expect"], checks.where(i, step)
        elif do in ("exec", "fenced"):
            lease = checks.leases[step["lease"]]
            got = error = None
            try:
                got = (lease.exec(*step["command"]) if do == "exec"
                       else lease.fenced(step["gate"], *step["command"]))
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_reply(i, step, got, error)
        elif do == "wait_lost":
            assert checks.leases[step["lease"]].lost.wait(step["within_ms"] / 1000), checks.where(i, step)
        elif do == "cancelled_wait":
            # Ctrl-C, to the main thread, once it waits in the server's line
            # (a signal there lands in its socket read).
            main = threading.main_thread().ident

            def interrupt():
                time.sleep(step["cancel_after_ms"] / 1000)
                deadline = time.monotonic() + 10
                while server.info("waiters") < 1 and time.monotonic() < deadline:
                    time.sleep(0.005)
                signal.pthread_kill(main, signal.SIGINT)

            timer = threading.Thread(target=interrupt)
            # As an interactive program has it (a test run in the background
            # of a shell starts with SIGINT ignored).
            previous = signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                timer.start()
                plain["renew"].acquire(step["key"], ttl=step["ttl_ms"] / 1000, timeout=30)
                raise AssertionError(f"{checks.where(i, step)}: the wait was granted")
            except KeyboardInterrupt:
                pass
            finally:
                timer.join()
                signal.signal(signal.SIGINT, previous)
        else:
            raise AssertionError(f"unknown step {do}")


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_asyncio(scenario):
    server = Server(with_module=scenario.get("server") != "plain")
    try:
        asyncio.run(run_async(server, scenario))
    finally:
        server.stop()


async def run_async(server, scenario):
    checks = Checks(server, scenario)
    client = aredis.Redis(port=server.port)
    plain = {"renew": async_api.Locks(client, renew=True),
             "still": async_api.Locks(client, renew=False)}
    observers: dict = {}
    campaigns: dict = {}
    try:
        await run_async_steps(server, scenario, checks, plain, observers, campaigns)
    finally:
        for observer, _, pump in observers.values():
            await observer.aclose()
            pump.cancel()
        for task in campaigns.values():
            task.cancel()
        for locks in plain.values():
            await locks.aclose()
        await client.aclose()


async def campaign_async(locks, step):
    try:
        return await locks.campaign(step["key"], step["value"], **campaign_args(step)), None
    except async_api.NotAcquired:
        return None, None
    except Exception as e:  # noqa: BLE001
        return None, e


async def run_async_steps(server, scenario, checks, plain, observers, campaigns):
    for i, step in enumerate(scenario["steps"]):
        do = step["do"]
        if do == "campaign":
            locks = plain["renew" if step.get("renew", True) else "still"]
            if step.get("background"):
                campaigns[step["as"]] = asyncio.create_task(campaign_async(locks, step))
            else:
                checks.judge_acquire(i, step, *await campaign_async(locks, step))
            continue
        if do == "campaigned":
            task = campaigns.pop(step["as"])
            try:
                outcome = await asyncio.wait_for(task, step["within_ms"] / 1000)
            except asyncio.TimeoutError:
                raise AssertionError(f"{checks.where(i, step)}: the campaign did not end in time")
            checks.judge_acquire(i, step, *outcome)
            continue
        if do == "proclaim":
            error = None
            try:
                await checks.leases[step["as"]].proclaim(step["value"])
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_proclaim(i, step, error)
            continue
        if do == "leader":
            checks.judge_leader(i, step, await plain["renew"].leader(step["key"]))
            continue
        if do == "observe":
            observer = plain["renew"].observe(step["key"])
            items: asyncio.Queue = asyncio.Queue()

            async def pump(observer=observer, items=items):
                try:
                    async for item in observer:
                        items.put_nowait(item)
                except Exception as e:  # noqa: BLE001
                    items.put_nowait(Failed(e))

            observers[step["as"]] = (observer, items, asyncio.create_task(pump()))
            continue
        if do == "observed":
            _, items, _ = observers[step["as"]]
            try:
                got = await asyncio.wait_for(items.get(), step["within_ms"] / 1000)
            except asyncio.TimeoutError:
                got = NOTHING
            checks.judge_observed(i, step, got)
            continue
        if do == "sleep_ms":
            await asyncio.sleep(step["ms"] / 1000)
            continue
        if checks.common(i, step):
            continue
        if do == "acquire":
            locks = plain["renew" if step.get("renew", True) else "still"]
            lease = error = None
            try:
                kwargs = acquire_args(step, checks.leases)
                if "keys" in step:
                    lease = await locks.acquire_all(step["keys"], **kwargs)
                else:
                    lease = await locks.acquire(step["key"], **kwargs)
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_acquire(i, step, lease, error)
        elif do == "release":
            assert await checks.leases[step["lease"]].release() == step["expect"], checks.where(i, step)
        elif do in ("exec", "fenced"):
            lease = checks.leases[step["lease"]]
            got = error = None
            try:
                got = await (lease.exec(*step["command"]) if do == "exec"
                             else lease.fenced(step["gate"], *step["command"]))
            except Exception as e:  # noqa: BLE001
                error = e
            checks.judge_reply(i, step, got, error)
        elif do == "wait_lost":
            await asyncio.wait_for(checks.leases[step["lease"]].lost.wait(), step["within_ms"] / 1000)
        elif do == "cancelled_wait":
            task = asyncio.create_task(
                plain["renew"].acquire(step["key"], ttl=step["ttl_ms"] / 1000, timeout=30))
            await asyncio.sleep(step["cancel_after_ms"] / 1000)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            raise AssertionError(f"unknown step {do}")


def test_the_clients_speak_the_protocol_asked(server):
    # PY_PROTOCOL=2 (see conftest) must reach every client the scenarios
    # make, or their RESP2 run would be a second RESP3 one.
    asked = os.environ.get("PY_PROTOCOL")
    r = server.client()
    spoken = str(r.client_info()["resp"])
    assert spoken == asked if asked else spoken in ("2", "3")
    import redis.asyncio as aredis

    async def main():
        ar = aredis.Redis(port=server.port)
        try:
            return str((await ar.client_info())["resp"])
        finally:
            await ar.aclose()

    assert asyncio.run(main()) == spoken
