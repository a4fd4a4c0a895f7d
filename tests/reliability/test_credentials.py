"""Credentials: revoking a key or deleting a tenant stops its work at once, a recreated tenant
starts clean, failed authentications are throttled per peer, TLS and mTLS serve, and errors that
are nobody's domain reach clients as INTERNAL without internals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import anyio
import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from fairgate.v1 import admin_pb2, gateway_pb2_grpc
from fairgate.v1 import gateway_pb2 as pb
from gateway.server import UnsafeSettings, check_exposure, running_gateway
from gateway.settings import Settings
from tenants import MemoryQuotaStore, Tenant, TenantQuota
from tests.gateway.conftest import ADMIN_KEY, sim_core
from tests.reliability.harness import Reliable, reliable_gateway, roots
from tests.serving import CountingStore

pytestmark = pytest.mark.anyio
SLOW = 0.01  # a simulated step: a 200-token call runs about 2 s


async def next_event(stream: grpc.aio.UnaryStreamCall[object, pb.JobEvent]) -> pb.JobEvent:
    with anyio.fail_after(5):
        event = await stream.read()
    assert event is not grpc.aio.EOF
    return event


async def started(
    h: Reliable, tenant: str
) -> tuple[str, grpc.aio.UnaryStreamCall[object, pb.JobEvent]]:
    """A long job of the tenant's, running, and its RunJob stream."""
    stream = h.stub.RunJob(pb.SubmitJobRequest(job=roots(1, 200)), metadata=h.auth(tenant))
    first = await next_event(stream)
    h.jobs[tenant].append(first.job_id)
    return first.job_id, stream


async def rest_of(stream: grpc.aio.UnaryStreamCall[object, pb.JobEvent]) -> list[pb.JobEvent]:
    events = []
    with anyio.fail_after(5):
        while (event := await stream.read()) is not grpc.aio.EOF:
            events.append(event)
    return events


async def test_revoking_a_key_cancels_its_jobs_and_closes_its_streams() -> None:
    async with reliable_gateway(core=sim_core(SLOW)) as h:
        await h.tenant("acme")
        other = h.keys["acme"]
        revoked_key = await h.admin.IssueKey(
            admin_pb2.IssueKeyRequest(tenant_id="acme"), metadata=h.admin_auth
        )
        h.keys["acme-old"] = revoked_key.plaintext
        # the doomed key runs a job and watches a job the other key runs
        doomed_job, doomed_stream = await started(h, "acme-old")
        kept = await h.submit("acme", roots(1, 300))  # still running when the key goes
        request = pb.WatchJobRequest(job_id=kept.job_id)
        watch = h.stub.WatchJob(request, metadata=h.auth("acme-old"))
        await next_event(watch)
        revoke = admin_pb2.RevokeKeyRequest(tenant_id="acme", key_id=revoked_key.key.key_id)
        await h.admin.RevokeKey(revoke, metadata=h.admin_auth)
        for stream in (doomed_stream, watch):
            with pytest.raises(grpc.aio.AioRpcError) as closed:
                await rest_of(stream)
            assert closed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # no 5-second cache
            await h.stub.GetJob(pb.GetJobRequest(job_id=doomed_job), metadata=h.auth("acme-old"))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        h.keys["acme"] = other
        doomed = await h.stub.GetJob(pb.GetJobRequest(job_id=doomed_job), metadata=h.auth("acme"))
        assert doomed.state == pb.JOB_STATE_CANCELLED and "revoked" in doomed.nodes[0].reason
        assert (await h.finished("acme", kept.job_id)).state == pb.JOB_STATE_SUCCEEDED
        h.jobs["acme"] += h.jobs.pop("acme-old")
        await h.unharmed()


async def test_a_deleted_tenant_stops_at_once_and_its_id_starts_clean() -> None:
    async with reliable_gateway(core=sim_core(SLOW)) as h:
        await h.tenant("gone")
        job_id, stream = await started(h, "gone")
        await h.admin.DeleteTenant(
            admin_pb2.DeleteTenantRequest(tenant_id="gone"), metadata=h.admin_auth
        )
        with pytest.raises(grpc.aio.AioRpcError) as closed:
            await rest_of(stream)
        assert closed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert h.gateway.dispatcher.runs == {}  # its job was cancelled
        del h.jobs["gone"]
        await h.tenant("gone")  # the same id again, with a new key
        with pytest.raises(grpc.aio.AioRpcError) as unseen:
            await h.stub.GetJob(pb.GetJobRequest(job_id=job_id), metadata=h.auth("gone"))
        assert unseen.value.code() == grpc.StatusCode.NOT_FOUND
        await h.unharmed()


async def guesses(h: Reliable, count: int) -> list[grpc.aio.AioRpcError]:
    """`count` calls with a key nobody issued, from the test's address; their refusals."""
    guess = (("authorization", "Bearer fg_0123456789abcdef_" + "a" * 43),)
    refusals = []
    for _ in range(count):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await h.stub.GetJob(pb.GetJobRequest(job_id="x"), metadata=guess)
        refusals.append(refused.value)
    return refusals


class HeldStore(MemoryQuotaStore):
    """The in-memory store whose next answer of the method armed (`authenticate`: the key is
    valid, or `get_tenant`: a tenant's record) comes only when the test lets it."""

    def __init__(self) -> None:
        super().__init__()
        self.armed: str | None = None
        self.asked, self.answer = anyio.Event(), anyio.Event()

    async def _held(self, method: str) -> None:
        if self.armed == method:
            self.armed = None
            self.asked.set()
            await self.answer.wait()

    async def authenticate(self, key: str) -> str:
        tenant = await super().authenticate(key)
        await self._held("authenticate")
        return tenant

    async def get_tenant(self, tenant_id: str) -> Tenant:
        tenant = await super().get_tenant(tenant_id)
        await self._held("get_tenant")
        return tenant


async def test_a_key_revoked_while_it_is_looked_up_admits_no_job() -> None:
    """The revocation came after the store had found the key valid, before its submission was
    admitted: a check taken as the handler began, after the lookup, missed it, and the job ran."""
    store = HeldStore()
    async with reliable_gateway(store=store) as h:
        await h.tenant("acme")
        store.armed = "authenticate"
        submitting = h.stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=h.auth("acme"))
        with anyio.fail_after(5):
            await store.asked.wait()
        (key,) = await store.list_keys("acme")
        key_id = key.key_id
        revoke = admin_pb2.RevokeKeyRequest(tenant_id="acme", key_id=key_id)
        await h.admin.RevokeKey(revoke, metadata=h.admin_auth)
        store.answer.set()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await submitting
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await h.usage("acme")).queued_jobs == 0


async def refused_code(call: grpc.aio.UnaryUnaryCall[object, object]) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value.code()


async def test_a_key_revoked_while_it_is_looked_up_is_not_cached_again() -> None:
    """The store found the key valid before the revocation and answered after it: that answer,
    cached after the revocation had dropped the cache, let the revoked key work on."""
    store = HeldStore()
    async with reliable_gateway(store=store) as h:
        await h.tenant("acme")
        store.armed = "authenticate"
        racing = h.stub.GetJob(pb.GetJobRequest(job_id="x"), metadata=h.auth("acme"))
        with anyio.fail_after(5):
            await store.asked.wait()
        (key,) = await store.list_keys("acme")
        revoke = admin_pb2.RevokeKeyRequest(tenant_id="acme", key_id=key.key_id)
        await h.admin.RevokeKey(revoke, metadata=h.admin_auth)
        store.answer.set()
        raced = await refused_code(racing)
        later = h.stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=h.auth("acme"))
        assert await refused_code(later) == grpc.StatusCode.UNAUTHENTICATED
        assert raced == grpc.StatusCode.UNAUTHENTICATED
        assert (await h.usage("acme")).queued_jobs == 0


async def test_a_deleted_tenants_key_looked_up_meanwhile_never_acts_for_its_successor() -> None:
    """The old key's lookup answered after the tenant was deleted and created again under its
    id: cached, the deleted customer's key submitted into the new customer's tenant."""
    store = HeldStore()
    async with reliable_gateway(store=store) as h:
        await h.tenant("acme")
        old_key = h.auth("acme")
        store.armed = "authenticate"
        racing = h.stub.GetJob(pb.GetJobRequest(job_id="x"), metadata=old_key)
        with anyio.fail_after(5):
            await store.asked.wait()
        delete = admin_pb2.DeleteTenantRequest(tenant_id="acme")
        await h.admin.DeleteTenant(delete, metadata=h.admin_auth)
        await h.tenant("acme")  # a new customer under the id, with a new key
        store.answer.set()
        raced = await refused_code(racing)
        later = h.stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=old_key)
        assert await refused_code(later) == grpc.StatusCode.UNAUTHENTICATED
        assert raced == grpc.StatusCode.UNAUTHENTICATED
        assert (await h.usage("acme")).queued_jobs == 0


async def test_a_stream_opening_while_its_key_is_revoked_is_closed_too() -> None:
    """The key passed, then the stream read its tenant's quota while the key was revoked: the
    revocation closed the streams open then, and this one, opened after, watched the tenant's
    job to its end under a revoked key."""
    store = HeldStore()
    async with reliable_gateway(core=sim_core(SLOW), store=store) as h:
        await h.tenant("acme")
        kept = await h.submit("acme", roots(1, 300))  # another key's job, running throughout
        doomed = await h.admin.IssueKey(
            admin_pb2.IssueKeyRequest(tenant_id="acme"), metadata=h.admin_auth
        )
        h.keys["acme-old"] = doomed.plaintext
        h.gateway.service._quotas.clear()  # the quota cached a second ago ran out
        store.armed = "get_tenant"
        watch = h.stub.WatchJob(pb.WatchJobRequest(job_id=kept.job_id), metadata=h.auth("acme-old"))
        with anyio.fail_after(5):
            await store.asked.wait()
        revoke = admin_pb2.RevokeKeyRequest(tenant_id="acme", key_id=doomed.key.key_id)
        await h.admin.RevokeKey(revoke, metadata=h.admin_auth)
        store.answer.set()
        with pytest.raises(grpc.aio.AioRpcError) as closed:
            await rest_of(watch)
        assert closed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert (await h.finished("acme", kept.job_id)).state == pb.JOB_STATE_SUCCEEDED
        await h.unharmed()


async def test_failed_authentications_are_throttled_per_peer() -> None:
    store = CountingStore()
    async with reliable_gateway(store=store, auth_failures_per_minute=5) as h:
        await h.tenant("acme")
        refusals = await guesses(h, 8)
        assert [r.code() for r in refusals] == [grpc.StatusCode.UNAUTHENTICATED] * 5 + [
            grpc.StatusCode.RESOURCE_EXHAUSTED
        ] * 3
        assert store.authentications == 5  # throttled guesses never reach the store
        status = rpc_status.from_call(refusals[-1])
        assert status is not None
        kinds = [d for d in status.details if d.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
        assert kinds


async def test_a_tenants_key_on_the_admin_service_is_looked_up_once() -> None:
    """A tenant's valid key on an Admin method was looked up in the store every time, past the
    key cache, the failure throttle and the tenant's RPC count: a tenant could send the store
    as many lookups as it sent requests."""
    store = CountingStore()
    async with reliable_gateway(store=store) as h:
        await h.tenant("acme")
        before = store.authentications
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await h.admin.ListTenants(admin_pb2.ListTenantsRequest(), metadata=h.auth("acme"))
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert store.authentications - before <= 1
        await h.unharmed()


async def test_a_guesser_on_a_shared_address_does_not_lock_out_keys_that_passed() -> None:
    """Behind a load balancer every caller has its address: a guesser emptying that address's
    bucket must not refuse the tenants whose keys passed, only keys not seen yet."""
    store = CountingStore()
    async with reliable_gateway(store=store, auth_failures_per_minute=3) as h:
        await h.tenant("acme")
        await h.tenant("newcomer")
        await h.serving()  # the bystander's key passes
        with pytest.raises(grpc.aio.AioRpcError) as unknown:  # acme's key passes, its job is not
            await h.stub.GetJob(pb.GetJobRequest(job_id="x"), metadata=h.auth("acme"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        refusals = await guesses(h, 4)
        assert refusals[-1].code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # its address is throttled
        for tenant, code in (
            ("acme", grpc.StatusCode.NOT_FOUND),  # served as before
            ("newcomer", grpc.StatusCode.RESOURCE_EXHAUSTED),  # not seen yet: a guess
        ):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await h.stub.GetJob(pb.GetJobRequest(job_id="x"), metadata=h.auth(tenant))
            assert caught.value.code() == code
        await h.unharmed()


def make_certs(directory: Path) -> dict[str, Path]:
    """A CA, a server certificate for 'localhost' and a client certificate, by openssl."""
    files = {
        name: directory / f"{name}.pem"
        for name in ("ca", "ca-key", "server", "server-key", "client", "client-key")
    }

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(files["ca-key"]),
        "-out",
        str(files["ca"]),
    )
    for who, cn in (("server", "localhost"), ("client", "client")):
        csr = directory / f"{who}.csr"
        ext = directory / f"{who}.ext"
        ext.write_text("subjectAltName=DNS:localhost\n" if who == "server" else "")
        run(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={cn}",
            "-keyout",
            str(files[f"{who}-key"]),
            "-out",
            str(csr),
        )
        run(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(files["ca"]),
            "-CAkey",
            str(files["ca-key"]),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(ext),
            "-out",
            str(files[who]),
        )
    return files


def test_tls_files_that_do_not_make_a_pair_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """A key of another certificate was found only as the port was bound, after the engine
    had loaded, and read "Failed to bind to address"."""
    certs = make_certs(tmp_path)
    settings = Settings(
        admin_key=ADMIN_KEY, tls_cert_file=certs["server"], tls_key_file=certs["client-key"]
    )
    with pytest.raises(UnsafeSettings, match="TLS: tls_cert_file"):
        check_exposure(settings)


@pytest.mark.parametrize("mutual", [False, True])
async def test_tls_and_mutual_tls(tmp_path: Path, mutual: bool) -> None:
    certs = make_certs(tmp_path)
    settings = Settings(
        port=0,
        admin_key=ADMIN_KEY,
        tls_cert_file=certs["server"],
        tls_key_file=certs["server-key"],
        tls_client_ca_file=certs["ca"] if mutual else None,
    )
    store = MemoryQuotaStore()
    await store.create_tenant("acme", "Acme", TenantQuota())
    key = (await store.issue_key("acme"))[1]
    auth = (("authorization", f"Bearer {key}"),)
    async with running_gateway(settings, core=sim_core(), store=store) as gateway:
        target = f"localhost:{gateway.port}"
        ca = certs["ca"].read_bytes()
        client = (
            grpc.ssl_channel_credentials(
                ca, certs["client-key"].read_bytes(), certs["client"].read_bytes()
            )
            if mutual
            else grpc.ssl_channel_credentials(ca)
        )
        async with grpc.aio.secure_channel(target, client) as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            job = await stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=auth)
            assert job.job_id
        refused_credentials = [grpc.ssl_channel_credentials(ca)] if mutual else []
        for credentials in refused_credentials:  # mTLS: a client without a certificate
            async with grpc.aio.secure_channel(target, credentials) as channel:
                stub = gateway_pb2_grpc.GatewayStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=auth)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        async with grpc.aio.insecure_channel(target) as channel:  # plaintext is not served
            stub = gateway_pb2_grpc.GatewayStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as plain:
                await stub.SubmitJob(pb.SubmitJobRequest(job=roots(1)), metadata=auth, timeout=5)
            assert plain.value.code() == grpc.StatusCode.UNAVAILABLE


class BrokenStore(MemoryQuotaStore):
    """A store whose tenant lookups fail, once broken, with a bug that names internals."""

    broken = False

    async def get_tenant(self, tenant_id: str) -> Tenant:
        if self.broken and tenant_id == "victim":
            raise RuntimeError("secret detail: connected to 10.1.2.3:6379 as admin")
        return await super().get_tenant(tenant_id)


async def test_an_unexpected_error_is_internal_and_tells_nothing() -> None:
    store = BrokenStore()
    async with reliable_gateway(store=store) as h:
        await h.tenant("victim")
        store.broken = True
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await h.submit("victim", roots(1))
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert failed.value.details() == "internal error"
        store.broken = False
        await h.unharmed()
