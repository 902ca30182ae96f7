"""`ServerGeneration` under a trainer of two processes (gloo, FSDP2-sharded weights) against stand-in servers:
every rank gathers, rank 0 alone pushes (each server loads each update once, whole), every rank samples the
pushed version from its own first server, and rank 0's failed push stops rank 1 too, within the time limit."""

from __future__ import annotations

import multiprocessing
import time

import torch

from rlvr_lightning.policies import SamplingConfig, ServerGeneration
from rlvr_lightning.serving.client import RolloutServerError

WORLD = 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))


def _rank(rank: int, init_file: str, addresses: list[str], weight_dir: str, sync_timeout_s: float, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = _model()
    fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
    backend = ServerGeneration(addresses, weight_dir=weight_dir, sync_timeout_s=sync_timeout_s)
    sampling = SamplingConfig(max_new_tokens=3, temperature=0.7)
    started = time.monotonic()
    try:
        for update in range(2):
            output = backend.generate(model, None, [[1 + rank]], 2, sampling, eos_token_ids=[2], pad_token_id=0)
            if output.stats["engine/weight_version"] != update + 1:
                raise AssertionError(f"rank {rank} update {update} sampled version {output.stats}")
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1.0)  # the same update on every rank's shard
        results.put((rank, "ok", time.monotonic() - started))
    except (RolloutServerError, AssertionError) as error:
        results.put((rank, str(error), time.monotonic() - started))
    finally:
        dist.destroy_process_group()


def _run(servers, tmp_path, sync_timeout_s=30.0) -> dict[int, tuple[str, float]]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    args = (str(tmp_path / "init"), [s.address for s in servers], str(tmp_path), sync_timeout_s, results)
    processes = [context.Process(target=_rank, args=(rank, *args)) for rank in range(WORLD)]
    for process in processes:
        process.start()
    outcomes = {}
    for _ in processes:
        rank, outcome, seconds = results.get(timeout=120)
        outcomes[rank] = (outcome, seconds)
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return outcomes


def test_rank_0_alone_pushes_the_gathered_weights_once_per_update(servers, tmp_path):
    outcomes = _run(servers, tmp_path)
    assert {rank: outcome for rank, (outcome, _) in outcomes.items()} == {0: "ok", 1: "ok"}
    full = _model().state_dict()
    for server in servers:
        assert server.versions == [1, 2]  # one load per update, not one per rank
        for update, loaded in enumerate(server.loaded):
            assert sorted(loaded) == ["0.bias", "0.weight", "1.bias", "1.weight"]
            for name, tensor in full.items():  # whole tensors, not one rank's shard
                torch.testing.assert_close(loaded[name], tensor + update, atol=0, rtol=0)
    # each rank's one prompt per generation went to server `rank`: the ranks spread over the servers
    assert [[body["prompt"] for body in server.completions] for server in servers] == [[[1], [1]], [[2], [2]]]
    assert list(tmp_path.glob("rlvr_weights_*")) == []


def test_rank_0s_failed_push_stops_every_rank_within_the_time_limit(servers, tmp_path):
    servers[1].sync_delay = 5.0
    outcomes = _run(servers, tmp_path, sync_timeout_s=0.5)
    timeout = f"rollout server {servers[1].address}: weight sync (version 1) did not complete within 0.5 s"
    assert outcomes[0][0] == timeout
    assert outcomes[1][0] == f"rank 0's weight push failed: RolloutServerError: {timeout}"
    assert all(seconds < 5.0 for _, seconds in outcomes.values())
