from types import SimpleNamespace

import pytest
import torch

from rlvr_lightning.modules.step_metrics import publish_step_metrics


class CaptureLogger:
    def __init__(self) -> None:
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, metrics))


def fake_module(step: int = 4):
    trainer = SimpleNamespace(
        world_size=1,
        loggers=[CaptureLogger()],
        log_every_n_steps=1,
        should_stop=False,
        current_epoch=0,
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=step)),
        callback_metrics={},
        progress_bar_metrics={},
    )
    return SimpleNamespace(trainer=trainer, device=torch.device("cpu"))


def test_tensors_and_numbers_are_published_once_each_under_their_names():
    module = fake_module()
    metrics = {
        "a": torch.tensor(1.5),
        "skipped": 3.0,
        "b": torch.tensor([2.5]),  # one element, any shape
        "count": torch.tensor(7),  # integer tensor
        "time": 0.25,
    }
    floats = publish_step_metrics(module, metrics, progress_bar={"A": "a"})
    assert floats == {"a": 1.5, "b": 2.5, "count": 7.0, "skipped": 3.0, "time": 0.25}
    step, logged = module.trainer.loggers[0].logged[0]
    assert step == 4 and logged == {**floats, "epoch": 0.0}
    assert {k: v.item() for k, v in module.trainer.callback_metrics.items()} == floats
    assert module.trainer.progress_bar_metrics == {"A": 1.5}


@pytest.mark.parametrize("metrics", [{"only": 2.0}, {"only": torch.tensor(2.0)}])
def test_only_numbers_or_only_tensors(metrics):
    assert publish_step_metrics(fake_module(), metrics) == {"only": 2.0}
