"""One logging facade over TensorBoard (default), Weights & Biases, the console, or nothing."""
from __future__ import annotations

import math
import os
from pathlib import Path

from marlkit.errors import ConfigError


class Logger:
    def __init__(self, kind: str, run_dir: Path, config: dict, project: str = "marlkit"):
        self.kind = kind
        self._backend = None
        if kind == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter
            self._backend = SummaryWriter(log_dir=str(run_dir))
        elif kind == "wandb":
            self._backend = _start_wandb(run_dir, config, project)

    def log(self, metrics: dict[str, float], step: int) -> None:
        metrics = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
        if not metrics:
            return
        if self.kind == "tensorboard":
            for key, value in metrics.items():
                self._backend.add_scalar(key, value, step)
        elif self.kind == "wandb":
            self._backend.log(metrics, step=step)
        elif self.kind == "console":
            print(f"[{step:>10}] " + "  ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())), flush=True)

    def close(self) -> None:
        if self.kind == "tensorboard":
            self._backend.close()
        elif self.kind == "wandb":
            self._backend.finish()


def _start_wandb(run_dir: Path, config: dict, project: str):
    try:
        import wandb
    except ImportError:
        raise ConfigError("--logger wandb needs Weights & Biases: pip install 'marlkit[wandb]' "
                          "(or choose --logger tensorboard)") from None
    has_key = bool(os.environ.get("WANDB_API_KEY")) or Path.home().joinpath(".netrc").is_file()
    # Without credentials wandb would prompt for a key and wait forever; offline runs can be synced later.
    mode = os.environ.get("WANDB_MODE") or ("online" if has_key else "offline")
    run = wandb.init(project=project, dir=str(run_dir), config=config, mode=mode, name=run_dir.name,
                     settings=wandb.Settings(init_timeout=60, silent=True))
    if mode == "offline":
        why = "WANDB_MODE=offline" if os.environ.get("WANDB_MODE") else "no wandb API key was found"
        where = Path(run.dir).parent
        print(f"wandb: logging offline ({why}) to {where}; upload it later with: wandb sync {where}", flush=True)
    return run
