"""Python's official gRPC client (grpcio, grpcio-status) against the layer.

Run by tests/grpc.rs (`python_client_sees_every_answer`), which starts the Rust server of
the example's proto (examples/proto/shop.proto) on a loopback port:

    python client.py --addr 127.0.0.1:PORT --proto examples/proto/shop.proto --out DIR

Stubs are generated from the proto into DIR with grpcio-tools first. Each scenario is one
answer of the layer's table (src/grpc/mod.rs, the README's gRPC section), as a gRPC client
outside Rust reads it: the status code, message, `google.rpc` details, and the initial and
trailing metadata. Prints one line per scenario and "N passed, M failed"; exits 1 when a
scenario failed.

What the server does (tests/grpc.rs): CreateOrder is keyed by `request_id`, Pay by the
`idempotency-key` metadata entry, both scoped by `authorization`; requests over 1024 bytes
are refused, answers over 256 bytes are not stored; the key `review-1` is held for review and
the store fails for the key `store-down`. CreateOrder's item chooses the handler's answer:
`fail` is UNAVAILABLE and `internal` INTERNAL on their first run, `invalid` is always
INVALID_ARGUMENT with a BadRequest and an `x-field` trailer, `slow` works 1.5 s; Pay is
UNAVAILABLE on the first run of each key.
"""

import argparse
import os
import sys
import time
import traceback

import grpc
from grpc_status import rpc_status
from google.rpc import error_details_pb2

AUTH = ("authorization", "Bearer py")
RESULTS = []


def scenario(fn):
    """Runs `fn` as one scenario and records whether its checks held."""
    try:
        fn()
        RESULTS.append((fn.__name__, None))
        print(f"ok    {fn.__name__}", flush=True)
    except Exception:  # noqa: BLE001 - every failure is reported, then counted
        RESULTS.append((fn.__name__, traceback.format_exc()))
        print(f"FAIL  {fn.__name__}\n{traceback.format_exc()}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def md(pairs):
    """Metadata as a dict of name to list of values."""
    out = {}
    for key, value in pairs or ():
        out.setdefault(key, []).append(value)
    return out


def clean_metadata(call):
    """No answer carries `content-length` metadata, as no plain tonic answer does."""
    for where, pairs in (("initial", call.initial_metadata()), ("trailing", call.trailing_metadata())):
        check("content-length" not in md(pairs), f"content-length in {where} metadata: {pairs}")


def details(call):
    """The `google.rpc` details of an error, by type name."""
    status = rpc_status.from_call(call)
    check(status is not None, f"no grpc-status-details-bin on {call.code()}: {call.details()}")
    check(status.code == call.code().value[0], "details' code differs from the status")
    out = {}
    for any_ in status.details:
        for name in ("ErrorInfo", "RetryInfo", "BadRequest", "PreconditionFailure"):
            if any_.Is(getattr(error_details_pb2, name).DESCRIPTOR):
                msg = getattr(error_details_pb2, name)()
                any_.Unpack(msg)
                out[name] = msg
    return out


def error(callable_, request, **kw):
    """The RpcError of a call that must fail (each scenario checks its code first, then
    its metadata with `clean_metadata`)."""
    try:
        callable_.with_call(request, **kw)
    except grpc.RpcError as e:
        return e
    raise AssertionError("the call succeeded")


def ok(callable_, request, **kw):
    response, call = callable_.with_call(request, **kw)
    check(call.code() == grpc.StatusCode.OK, f"{call.code()}")
    clean_metadata(call)
    return response, call


def refusal(e, code, reason, *, mentions=(), avoids=("Idempotency-Key", "Idempotency Key")):
    """A refusal of the layer: its code, the ErrorInfo and a message in gRPC words."""
    check(e.code() == code, f"code {e.code()} ({e.details()}), expected {code}")
    d = details(e)
    check("ErrorInfo" in d, f"no ErrorInfo: {d}")
    check(d["ErrorInfo"].domain == "idemstore", f"domain {d['ErrorInfo'].domain}")
    check(d["ErrorInfo"].reason == reason, f"reason {d['ErrorInfo'].reason}, expected {reason}")
    for word in mentions:
        check(word in e.details(), f"message {e.details()!r} does not mention {word!r}")
    for word in avoids:
        check(word not in e.details(), f"message {e.details()!r} speaks of {word!r}")
    check("idempotent-replayed" not in md(e.trailing_metadata()), "a refusal marked as replayed")
    clean_metadata(e)
    return d


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--addr", required=True)
    parser.add_argument("--proto", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from grpc_tools import protoc

    proto_dir, proto_file = os.path.split(os.path.abspath(args.proto))
    generated = protoc.main(
        ["protoc", f"-I{proto_dir}", f"--python_out={args.out}", f"--grpc_python_out={args.out}", proto_file]
    )
    check(generated == 0, f"grpcio-tools could not generate stubs from {args.proto}")
    sys.path.insert(0, args.out)
    import shop_pb2 as pb
    import shop_pb2_grpc

    channel = grpc.insecure_channel(args.addr)
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = shop_pb2_grpc.OrdersStub(channel)

    def order(request_id, item, quantity=2):
        return pb.CreateOrderRequest(request_id=request_id, item=item, quantity=quantity)

    def pay_md(*keys):
        return [AUTH] + [("idempotency-key", k) for k in keys]

    first = {}

    def new_key_runs_the_handler():
        response, call = ok(stub.CreateOrder, order("c-1", "book"), metadata=[AUTH])
        first["order"], first["initial"] = response, md(call.initial_metadata())
        check(response.item == "book" and response.quantity == 2, f"{response}")
        check("x-order" in first["initial"], f"no x-order: {call.initial_metadata()}")
        check("x-trace-bin" in first["initial"], f"no x-trace-bin: {call.initial_metadata()}")
        check("idempotent-replayed" not in first["initial"], "a first answer marked as replayed")
        check("idempotent-replayed" not in md(call.trailing_metadata()), "marked in trailers")

    def finished_key_replays_the_answer():
        response, call = ok(stub.CreateOrder, order("c-1", "book"), metadata=[AUTH])
        initial = md(call.initial_metadata())
        check(response == first["order"], f"{response} != {first['order']}")
        check(initial.get("idempotent-replayed") == ["true"], f"initial metadata {initial}")
        for name in ("x-order", "x-trace-bin"):
            check(initial.get(name) == first["initial"].get(name), f"{name}: {initial}")
        check("idempotent-replayed" not in md(call.trailing_metadata()), "marked in trailers")

    def same_request_id_other_request_is_failed_precondition():
        e = error(stub.CreateOrder, order("c-1", "pen"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.FAILED_PRECONDITION, "KEY_REUSED", mentions=("request_id",))
        violations = d["PreconditionFailure"].violations
        check(violations[0].subject == "request_id", f"{violations}")

    def empty_request_id_is_invalid_argument():
        e = error(stub.CreateOrder, order("", "book"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "KEY_MISSING", mentions=("request_id",))
        check(d["BadRequest"].field_violations[0].field == "request_id", f"{d['BadRequest']}")

    def request_id_over_255_bytes_is_invalid_argument():
        e = error(stub.CreateOrder, order("r" * 256, "book"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "KEY_INVALID", mentions=("request_id", "255"))
        check(d["BadRequest"].field_violations[0].field == "request_id", f"{d['BadRequest']}")

    def no_metadata_key_is_invalid_argument():
        e = error(stub.Pay, pb.PayRequest(order_id=1, cents=100), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "KEY_MISSING", mentions=("idempotency-key",))
        check(d["BadRequest"].field_violations[0].field == "idempotency-key", f"{d['BadRequest']}")

    def metadata_key_sent_twice_is_invalid_argument():
        e = error(stub.Pay, pb.PayRequest(order_id=1, cents=100), metadata=pay_md("a", "b"))
        refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "KEY_INVALID", mentions=("idempotency-key", "not several"))

    def empty_metadata_key_is_invalid_argument():
        e = error(stub.Pay, pb.PayRequest(order_id=1, cents=100), metadata=pay_md(""))
        refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "KEY_INVALID", mentions=("idempotency-key", "empty"))

    def no_scope_is_unauthenticated():
        e = error(stub.CreateOrder, order("c-2", "book"))
        refusal(e, grpc.StatusCode.UNAUTHENTICATED, "NO_SCOPE", mentions=("request_id",))

    def request_over_the_limit_is_resource_exhausted():
        e = error(stub.CreateOrder, order("c-3", "x" * 2000), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.RESOURCE_EXHAUSTED, "BODY_TOO_LARGE", mentions=("1024",))
        check(d["ErrorInfo"].metadata["limit"] == "1024", f"{d['ErrorInfo']}")

    def compressed_request_id_is_invalid_argument():
        # A message that gzip makes smaller: the client sends small ones uncompressed.
        e = error(stub.CreateOrder, order("c-4", "z" * 500), metadata=[AUTH], compression=grpc.Compression.Gzip)
        refusal(e, grpc.StatusCode.INVALID_ARGUMENT, "BODY_UNREADABLE", mentions=("compressed", "request id"))

    def duplicate_while_running_is_aborted_with_retry_info():
        running = stub.CreateOrder.future(order("c-slow", "slow"), metadata=[AUTH])
        time.sleep(0.5)
        e = error(stub.CreateOrder, order("c-slow", "slow"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.ABORTED, "IN_PROGRESS", mentions=("request_id",))
        delay = d["RetryInfo"].retry_delay.ToTimedelta().total_seconds()
        check(0 < delay <= 1, f"retry delay {delay}")
        done = running.result(timeout=10)
        again, call = ok(stub.CreateOrder, order("c-slow", "slow"), metadata=[AUTH])
        check(again == done, f"{again} != {done}")
        check(md(call.initial_metadata()).get("idempotent-replayed") == ["true"], "not replayed")

    def handler_unavailable_is_released_then_retried_then_replayed():
        e = error(stub.Pay, pb.PayRequest(order_id=7, cents=100), metadata=pay_md("p-1"))
        check(e.code() == grpc.StatusCode.UNAVAILABLE, f"{e.code()}: {e.details()}")
        check(e.details() == "gateway unavailable", f"message {e.details()!r}")
        check("idempotent-replayed" not in md(e.trailing_metadata()), "marked as replayed")
        clean_metadata(e)
        paid, call = ok(stub.Pay, pb.PayRequest(order_id=7, cents=100), metadata=pay_md("p-1"))
        check(paid.attempt == 2, f"{paid}")
        check("idempotent-replayed" not in md(call.initial_metadata()), "the retry marked as replayed")
        again, call = ok(stub.Pay, pb.PayRequest(order_id=7, cents=100), metadata=pay_md("p-1"))
        check(again == paid, f"{again} != {paid}")
        check(md(call.initial_metadata()).get("idempotent-replayed") == ["true"], "not replayed")

    def handler_internal_is_released():
        e = error(stub.CreateOrder, order("c-int", "internal"), metadata=[AUTH])
        check(e.code() == grpc.StatusCode.INTERNAL, f"{e.code()}: {e.details()}")
        check(e.details() == "a bug", f"message {e.details()!r}")
        clean_metadata(e)
        response, call = ok(stub.CreateOrder, order("c-int", "internal"), metadata=[AUTH])
        check("idempotent-replayed" not in md(call.initial_metadata()), "the retry marked as replayed")

    def handler_invalid_argument_is_stored_and_replayed_whole():
        e = error(stub.CreateOrder, order("c-inv", "invalid", quantity=0), metadata=[AUTH])
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, f"{e.code()}: {e.details()}")
        check(e.details() == "quantity must be positive", f"message {e.details()!r}")
        trailing = md(e.trailing_metadata())
        check(trailing.get("x-field") == ["quantity"], f"trailing metadata {trailing}")
        check("idempotent-replayed" not in trailing, "a first answer marked as replayed")
        check(not e.initial_metadata(), f"initial metadata {e.initial_metadata()}")
        d = details(e)
        check(d["BadRequest"].field_violations[0].field == "quantity", f"{d}")
        r = error(stub.CreateOrder, order("c-inv", "invalid", quantity=0), metadata=[AUTH])
        check((r.code(), r.details()) == (e.code(), e.details()), f"{r.code()}: {r.details()}")
        replayed = md(r.trailing_metadata())
        check(replayed.get("idempotent-replayed") == ["true"], f"trailing metadata {replayed}")
        check(replayed.get("x-field") == ["quantity"], f"trailing metadata {replayed}")
        check(not r.initial_metadata(), f"initial metadata {r.initial_metadata()}")
        check(details(r) == d, "the replayed details differ")
        clean_metadata(e)
        clean_metadata(r)

    def answer_over_the_stored_limit_is_never_run_again():
        big = "b" * 700
        response, _ = ok(stub.CreateOrder, order("c-big", big), metadata=[AUTH])
        check(response.item == big, "the first answer is sent whole")
        e = error(stub.CreateOrder, order("c-big", big), metadata=[AUTH])
        refusal(e, grpc.StatusCode.FAILED_PRECONDITION, "RESPONSE_NOT_STORED", mentions=("request_id",))

    def key_under_review_is_failed_precondition():
        e = error(stub.CreateOrder, order("review-1", "book"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.FAILED_PRECONDITION, "UNDER_REVIEW", mentions=("request_id",))
        check(d["PreconditionFailure"].violations[0].subject == "request_id", f"{d}")

    def store_failure_is_unavailable_with_retry_info():
        e = error(stub.CreateOrder, order("store-down", "book"), metadata=[AUTH])
        d = refusal(e, grpc.StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
        delay = d["RetryInfo"].retry_delay.ToTimedelta().total_seconds()
        check(delay == 1, f"retry delay {delay}")

    def streaming_rpc_is_not_guarded():
        for _ in range(2):
            orders = list(stub.WatchOrders(pb.WatchRequest(count=3)))
            check([o.id for o in orders] == [1, 2, 3], f"{orders}")

    for fn in (
        new_key_runs_the_handler,
        finished_key_replays_the_answer,
        same_request_id_other_request_is_failed_precondition,
        empty_request_id_is_invalid_argument,
        request_id_over_255_bytes_is_invalid_argument,
        no_metadata_key_is_invalid_argument,
        metadata_key_sent_twice_is_invalid_argument,
        empty_metadata_key_is_invalid_argument,
        no_scope_is_unauthenticated,
        request_over_the_limit_is_resource_exhausted,
        compressed_request_id_is_invalid_argument,
        duplicate_while_running_is_aborted_with_retry_info,
        handler_unavailable_is_released_then_retried_then_replayed,
        handler_internal_is_released,
        handler_invalid_argument_is_stored_and_replayed_whole,
        answer_over_the_stored_limit_is_never_run_again,
        key_under_review_is_failed_precondition,
        store_failure_is_unavailable_with_retry_info,
        streaming_rpc_is_not_guarded,
    ):
        scenario(fn)
    failed = sum(1 for _, failure in RESULTS if failure)
    print(f"grpcio: {len(RESULTS) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
