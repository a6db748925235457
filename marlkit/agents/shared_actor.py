"""The decentralised actor that MAPPO, IPPO and COMA share, as a part they hold (not a base class).

Each agent reads its own observation through the registered ``actor`` model, weights shared
across the group, and the agent id (``use_agent_id``) tells the agents apart: joined as a one-hot
before the encoder for a flat input, after the encoder's features for any other (images,
``(27, 5)`` arrays). The same encoding serves a per-agent critic (IPPO's) and a pooled one
(MAPPO's), so it takes any role's model.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from marlkit.errors import ConfigError
from marlkit.networks.base import Encoder
from marlkit.networks.distributions import ActionHead
from marlkit.registry import get_model
from marlkit.spec import EnvSpec, GroupSpec


class SharedActor:
    """Builds and reads one group's per-agent networks. ``agent`` is the registered name of the
    agent that holds it, for messages; ``cfg`` its config (``actor``, ``use_agent_id``,
    ``log_std_init``, and the other roles' models)."""

    def __init__(self, agent: str, group: GroupSpec, env: EnvSpec, cfg):
        self.agent, self.group, self.env, self.cfg = agent, group, env, cfg
        self.n_agents = group.n_agents
        self._eye: torch.Tensor | None = None

    # ------------------------------------------------------------------ building

    def id_at_input(self, shape: tuple[int, ...]) -> bool:
        return self.cfg.use_agent_id and len(shape) == 1

    def id_width_after(self, shape: tuple[int, ...]) -> int:
        """Width of the one-hot id appended to the features of an encoder of ``shape`` inputs."""
        return self.n_agents if self.cfg.use_agent_id and len(shape) != 1 else 0

    def model(self, role: str, shape: tuple[int, ...], per_agent: bool, ids: bool = True) -> Encoder:
        """The ``role`` model (``actor``, ``critic``) for inputs of ``shape``: per agent (the id may
        join the input) or once per env step (the state)."""
        model = getattr(self.cfg, role)
        if per_agent and ids and self.id_at_input(shape):
            shape = (shape[0] + self.n_agents,)
        # what the env's spec says about the input (image layout, sensor parts) reaches the models
        # that take it, unless the config sets it
        parts = self.group.obs_parts if per_agent else None
        said = {"channels_last": self.group.channels_last if per_agent else self.env.state_channels_last,
                "images": [list(p) for p in parts if len(p) == 3] or None if parts else None}
        model_cls = get_model(model.name)
        fill = {k: said[k] for k in model_cls.spec_kwargs if said.get(k) is not None and k not in model.kwargs}
        if fill:
            model = replace(model, kwargs={**model.kwargs, **fill})
        try:
            return model_cls(tuple(shape), model)
        except ConfigError as exc:
            raise ConfigError(f"agents.{self.agent}.{role}: {exc}") from None

    def encoder(self) -> Encoder:
        """The actor's encoder of each agent's observation."""
        return self.model("actor", self.group.obs_shape, per_agent=True)

    def head(self, encoder: Encoder) -> ActionHead:
        """The action head on the actor's features (and the id, where it joins after them)."""
        return ActionHead(self.group.action_space, encoder.out_dim + self.id_width_after(self.group.obs_shape),
                          self.cfg.log_std_init)

    # ------------------------------------------------------------------ reading

    def encode(self, encoder: nn.Module, x: torch.Tensor, hidden, episode_start, ids: bool = True,
               present: torch.Tensor | None = None, join_ids: bool = True):
        """Encode per-agent inputs ``[L, B, A, ...]`` with agents folded into the batch, the agent
        id joined (``ids``; ``join_ids=False``: at the input alone, not after the features) ->
        (features ``[L, B, A, F]``, hidden ``[B, A, H]`` or None).

        With ``present`` ``[L, B, A]`` (the agent mask), a feed-forward encoder reads the present
        slots alone and absent slots get zero features: every loss and pool masks them out, so
        their features change nothing that is learned or acted on, and in an env where agents die
        (half of a 48-agent battle is dead on average) they are most of the encoder's work. A
        recurrent encoder reads every slot: its memory runs through them in time order."""
        L, B, A = x.shape[:3]
        shape = tuple(x.shape[3:])
        if ids and self.id_at_input(shape):
            x = torch.cat([x.float(), self.ids(L, B, x.device)], -1)
        if present is not None and not encoder.is_recurrent and not bool(present.all()):
            rows = present.reshape(-1).nonzero().squeeze(1)
            features = torch.zeros(L * B * A, encoder.out_dim, device=x.device)
            if len(rows):
                encoded, _ = encoder(x.reshape(L * B * A, *x.shape[3:]).index_select(0, rows).unsqueeze(0))
                # CPU autocast promotes index_copy's source to float32, CUDA autocast does not
                features = features.index_copy(0, rows, encoded[0].to(features.dtype))
            return self.join_ids(features.reshape(L, B, A, -1), shape, ids and join_ids), None
        h = hidden.reshape(B * A, -1) if hidden is not None and encoder.is_recurrent else None
        starts = episode_start.reshape(L, B * A) if episode_start is not None else None
        features, h = encoder(x.reshape(L, B * A, *x.shape[3:]), h, starts)
        h = h.reshape(B, A, -1) if h is not None else None
        return self.join_ids(features.reshape(L, B, A, -1), shape, ids and join_ids), h

    def encode_trunk(self, encoder: nn.Module, x: torch.Tensor, hidden, episode_start,
                     present: torch.Tensor | None = None):
        """Per-agent inputs ``[L, B, A, ...]`` -> (the actor's features ``[L, B, A, F]``, the id
        joined after them where it joins there; the features of the encoder's feed-forward trunk
        ``[L, B, A, trunk_dim]``, without that id, for a critic that shares it; hidden ``[B, A, H]``
        or None). A feed-forward encoder is all trunk; a recurrent one's trunk runs once for both."""
        shape = tuple(x.shape[3:])
        if not encoder.is_recurrent:
            trunk, _ = self.encode(encoder, x, None, None, present=present, join_ids=False)
            return self.join_ids(trunk, shape, True), trunk, None
        L, B, A = x.shape[:3]
        z = self.trunk(encoder, x)
        h = hidden.reshape(B * A, -1) if hidden is not None else None
        starts = episode_start.reshape(L, B * A) if episode_start is not None else None
        features, h = encoder.recur(z.reshape(L, B * A, -1), h, starts)
        return self.join_ids(features.reshape(L, B, A, -1), shape, True), z, h.reshape(B, A, -1)

    def trunk(self, encoder: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A recurrent encoder's feed-forward trunk over per-agent inputs ``[L, B, A, ...]`` (the id
        joined at the input where it joins there) -> ``[L, B, A, trunk_dim]``; its memory is not run."""
        L, B, A = x.shape[:3]
        if self.id_at_input(tuple(x.shape[3:])):
            x = torch.cat([x.float(), self.ids(L, B, x.device)], -1)
        return encoder.trunk(x.reshape(L, B * A, *x.shape[3:])).reshape(L, B, A, -1)

    def join_ids(self, features: torch.Tensor, shape: tuple[int, ...], ids: bool) -> torch.Tensor:
        """The one-hot id after the features of an encoder of ``shape`` inputs (see ``id_width_after``)."""
        if ids and self.id_width_after(shape):
            L, B = features.shape[:2]
            features = torch.cat([features, self.ids(L, B, features.device)], -1)
        return features

    def ids(self, L: int, B: int, device) -> torch.Tensor:
        eye = self._eye   # made once: an eye per call is a twentieth of acting
        if eye is None or eye.device != torch.device(device):
            eye = self._eye = torch.eye(self.n_agents, dtype=torch.float32, device=device)
        return eye.expand(L, B, -1, -1)

    def policy(self, modules: nn.ModuleDict, obs, hidden, episode_start, action_mask, agent_mask=None):
        """The action distribution over ``[L, B, A]`` and the next actor hidden (see
        ``OnPolicyAgent.policy``), from ``modules["actor"]`` and ``modules["actor_head"]``."""
        features, hidden = self.encode(modules["actor"], obs, hidden, episode_start, present=agent_mask)
        return modules["actor_head"](features, action_mask), hidden
