"""A Unity player stand-in: a scripted two-team scene speaking the ML-Agents gRPC protocol.

``UnityEnvironment(file_name="tests/unity_standin/standin")`` launches it like a build (with
``--mlagents-port N``); it connects as the gRPC client, exactly as a Unity player does, and plays a
SoccerTwos-shaped scene:

- behaviours ``Soccer?team=0`` and ``Soccer?team=1``; ``--fields`` fields with two agents per team
  each (agent ids: field f holds ``4f, 4f+1`` in team 0 and ``4f+2, 4f+3`` in team 1);
- two vector sensors per agent (8 and 3 floats; ``--image CxHxW`` adds a camera, sent as ML-Agents
  3 sends one, channels first, uncompressed or with ``--png`` as a PNG; ``--no-vector`` drops the
  vector sensors);
- MultiDiscrete actions ``[3, 3, 3]`` with action masks (``--branches 5`` gives one Discrete branch,
  ``--branches ''`` none; ``--continuous N`` adds N continuous actions: hybrid, or continuous only);
- field f's episode lasts ``--episode-length + 2 f`` steps, so fields end at different times; an
  episode ends on a goal (team ``episode % 2`` scores: group reward +1 / -1, ``done``) or, every
  third episode, at its max step (``max_step_reached``, group reward 0). The ending agents appear
  in the terminal infos and, already reset, in the decision infos of the same message;
- the last agent of each team in field 0 requests a decision every ``--decision-period`` steps
  (its reward accumulates in between, as in Unity).

Each field's team is an ML-Agents group: agents carry group id ``1 + 2 field + team`` (all 0, no
group, with ``--no-group-ids``; ``--regroup-after K`` adds 100 to them from step K on).

Observations encode what a test needs to check: sensor 0 is ``[agent id, field, step in episode,
episode, last action (3 branches, zero-padded), 1]``; sensor 1 is ``[team, slot in team, 0.5]``;
``--obs-offset F:X`` adds X to every vector observation value of field F's agents (another scene
that differs in that field alone);
the camera's pixel ``(c, h, w)`` is ``image(agent id, step, shape)``, different along every axis.
Every agent gets ``0.01 * (sum of its last discrete action)`` per decision and ``-0.001`` per step.
``--log`` writes one JSON line per step: the actions received per agent id, masked choices taken,
and the fields that ended.

``--side-log`` writes one JSON line per side-channel message received: engine settings and
environment parameters, decoded.

Fault modes for tests: ``--die-after K`` exits abruptly after K steps, ``--hang-after K`` stops
answering after K steps, ``--never-connect`` never calls the server, ``--start-delay S`` connects
only after S seconds (a scene slow to load). With ``--fault-once PATH`` the die or hang fault
happens in one launch only, the first to create PATH: a relaunched scene then runs on.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
import uuid

import grpc
from mlagents_envs.communicator_objects.agent_info_pb2 import AgentInfoProto
from mlagents_envs.communicator_objects.brain_parameters_pb2 import ActionSpecProto, BrainParametersProto
from mlagents_envs.communicator_objects.capabilities_pb2 import UnityRLCapabilitiesProto
from mlagents_envs.communicator_objects.command_pb2 import QUIT, RESET, STEP
from mlagents_envs.communicator_objects.observation_pb2 import NONE, PNG, ObservationProto
from mlagents_envs.communicator_objects.unity_message_pb2 import UnityMessageProto
from mlagents_envs.communicator_objects.unity_to_external_pb2_grpc import UnityToExternalProtoStub
from mlagents_envs.side_channel import IncomingMessage

TEAMS = (0, 1)


ENGINE_CHANNEL = uuid.UUID("e951342c-4f7e-11ea-b238-784f4387d1f7")
PARAMETERS_CHANNEL = uuid.UUID("534c891e-810f-11ea-a9d0-822485860400")
ENGINE_SETTINGS = {0: ("width", "height"), 1: ("quality_level",), 2: ("time_scale",), 3: ("target_frame_rate",),
                   4: ("capture_frame_rate",)}


def side_channel_messages(data: bytes) -> list[dict]:
    """Decode the engine-configuration and environment-parameter messages, as a player's
    side channels do (others are listed by channel id)."""
    out, offset = [], 0
    while offset < len(data):
        channel = uuid.UUID(bytes_le=bytes(data[offset:offset + 16]))
        (length,) = struct.unpack_from("<i", data, offset + 16)
        message = IncomingMessage(bytes(data[offset + 20:offset + 20 + length]))
        offset += 20 + length
        if channel == ENGINE_CHANNEL:
            kind = message.read_int32()
            names = ENGINE_SETTINGS[kind]
            values = [message.read_float32()] if kind == 2 else [message.read_int32() for _ in names]
            out.append({"engine": dict(zip(names, values))})
        elif channel == PARAMETERS_CHANNEL:
            key = message.read_string()
            kind = message.read_int32()
            out.append({"parameter": {key: message.read_float32() if kind == 0 else None}})
        else:
            out.append({"channel": str(channel)})
    return out


def behaviour(team: int) -> str:
    return f"Soccer?team={team}"


def image(agent_id: int, step: int, shape: tuple[int, int, int]):
    """The camera of ``agent_id`` at episode step ``step``: uint8 ``[C, H, W]`` whose every pixel
    tells its place, so a layout mistake anywhere downstream shows."""
    import numpy as np
    c, h, w = np.indices(shape)
    return ((agent_id * 7 + step * 3 + c * 50 + h * 5 + w) % 256).astype(np.uint8)


def png(pixels) -> bytes:
    """``[C, H, W]`` uint8 (C = 1 or 3) as the PNG a Unity camera sensor sends."""
    import io

    from PIL import Image
    hwc = pixels.transpose(1, 2, 0)
    picture = Image.fromarray(hwc[..., 0] if hwc.shape[2] == 1 else hwc)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()


def masked_choices(agent_id: int, step: int, branches=(3, 3, 3)) -> list[tuple[int, int]]:
    """(branch, choice) pairs this agent may not pick at this step of its episode."""
    if agent_id % 2 == 0:
        pairs = [(0, 2)]
    else:
        pairs = [(1, 0)] if step % 2 == 0 else [(2, 1)]
    return [(b, c) for b, c in pairs if b < len(branches) and c < branches[b]]


class Field:
    def __init__(self, index: int, length: int):
        self.index, self.length = index, length
        self.step, self.episode = 0, 0

    def ends(self) -> tuple[bool, bool, int]:
        """(ended, by max step, scoring team) after the current step."""
        if self.step < self.length:
            return False, False, -1
        by_max_step = self.episode % 3 == 2
        return True, by_max_step, -1 if by_max_step else self.episode % 2


class Agent:
    def __init__(self, agent_id: int, field: Field, team: int, slot: int, period: int):
        self.id, self.field, self.team, self.slot, self.period = agent_id, field, team, slot, period
        self.last_action = [0, 0, 0]
        self.reward = 0.0

    def wants_decision(self) -> bool:
        return self.field.step % self.period == 0


class Scene:
    def __init__(self, args):
        self.args = args
        self.fields = [Field(f, args.episode_length + 2 * f) for f in range(args.fields)]
        self.agents = []
        for field in self.fields:
            for team in TEAMS:
                for slot in range(2):
                    agent_id = 4 * field.index + 2 * team + slot
                    period = args.decision_period if field.index == 0 and slot == 1 else 1
                    self.agents.append(Agent(agent_id, field, team, slot, period))
        self.deciding: dict[str, list[Agent]] = {behaviour(t): [] for t in TEAMS}
        self.steps = 0
        self.log = open(args.log, "a") if args.log else None

    def observations(self, agent: Agent) -> list[ObservationProto]:
        f = agent.field
        sensors = [[agent.id, f.index, f.step, f.episode, *agent.last_action, 1.0],
                   [agent.team, agent.slot, 0.5]]
        offset = self.args.obs_offset.get(f.index, 0.0)
        sensors = [[v + offset for v in values] for values in sensors]
        out = []
        for i, values in enumerate(sensors if not self.args.no_vector else []):
            ob = ObservationProto(shape=[len(values)], compression_type=NONE, name=f"vector_{i}")
            ob.float_data.data.extend(float(v) for v in values)
            out.append(ob)
        if self.args.image:
            pixels = image(agent.id, f.step, self.args.image)
            if self.args.png:
                ob = ObservationProto(shape=list(self.args.image), compression_type=PNG, name="camera",
                                      compressed_data=png(pixels))
            else:
                ob = ObservationProto(shape=list(self.args.image), compression_type=NONE, name="camera")
                ob.float_data.data.extend((pixels.reshape(-1) / 255.0).tolist())
            out.append(ob)
        return out

    def info(self, agent: Agent, done: bool = False, max_step: bool = False, group_reward: float = 0.0,
             reward: float | None = None) -> AgentInfoProto:
        group_id = 0 if self.args.no_group_ids else 1 + 2 * agent.field.index + agent.team
        if self.args.regroup_after is not None and self.steps >= self.args.regroup_after:
            group_id += 100
        info = AgentInfoProto(reward=agent.reward if reward is None else reward, done=done,
                              max_step_reached=max_step, id=agent.id, group_id=group_id, group_reward=group_reward)
        info.observations.extend(self.observations(agent))
        if not done and self.args.branches:
            forbidden = set(masked_choices(agent.id, agent.field.step, self.args.branches))
            info.action_mask.extend((b, c) in forbidden for b, n in enumerate(self.args.branches) for c in range(n))
        return info

    def reset(self) -> list:
        for field in self.fields:
            field.step = 0
        for agent in self.agents:
            agent.reward, agent.last_action = 0.0, [0, 0, 0]
        return []

    def step(self, agent_actions) -> list:
        record, violations = {}, 0
        for name, deciders in self.deciding.items():
            actions = agent_actions[name].value if name in agent_actions else []
            if len(actions) != len(deciders):
                sys.exit(f"standin: {name} got {len(actions)} actions for {len(deciders)} deciding agents")
            for agent, action in zip(deciders, actions):
                discrete = list(action.discrete_actions)
                forbidden = masked_choices(agent.id, agent.field.step, self.args.branches)
                violations += sum(discrete[b] == c for b, c in forbidden)
                agent.last_action = (discrete + [0, 0, 0])[:3]
                agent.reward += 0.01 * sum(discrete)
                record[agent.id] = {"discrete": discrete, "continuous": list(action.continuous_actions)}
        for agent in self.agents:
            agent.reward -= 0.001
        terminal = []
        for field in self.fields:
            field.step += 1
            ended, by_max_step, scorer = field.ends()
            if not ended:
                continue
            for agent in self.agents:
                if agent.field is field:
                    group_reward = 0.0 if scorer < 0 else (1.0 if agent.team == scorer else -1.0)
                    terminal.append((agent, by_max_step, group_reward))
        self.steps += 1
        if self.log is not None:
            self.log.write(json.dumps({"step": self.steps, "actions": record, "violations": violations,
                                       "ended": sorted({a.field.index for a, _, _ in terminal})}) + "\n")
            self.log.flush()
        return terminal

    def close_episodes(self, message: UnityMessageProto, terminal: list) -> None:
        """Terminal infos carry the final observation; then the fields restart their episode."""
        rl = message.unity_output.rl_output
        for agent, max_step, group_reward in terminal:
            rl.agentInfos[behaviour(agent.team)].value.append(
                self.info(agent, done=True, max_step=max_step, group_reward=group_reward))
            agent.reward = 0.0
        for field in {agent.field for agent, _, _ in terminal}:
            field.step = 0
            field.episode += 1

    def answer(self, terminal: list) -> UnityMessageProto:
        message = UnityMessageProto()
        message.header.status = 200
        self.close_episodes(message, terminal)
        rl = message.unity_output.rl_output
        self.deciding = {behaviour(t): [] for t in TEAMS}
        for agent in self.agents:
            if agent.wants_decision():
                rl.agentInfos[behaviour(agent.team)].value.append(self.info(agent))
                self.deciding[behaviour(agent.team)].append(agent)
                agent.reward = 0.0
        return message

    def initialization(self) -> UnityMessageProto:
        message = self.answer(self.reset())
        init = message.unity_output.rl_initialization_output
        init.name = "SoccerStandin"
        init.communication_version = "1.5.0"
        init.package_version = "2.0.1"
        init.capabilities.CopyFrom(UnityRLCapabilitiesProto(
            baseRLCapabilities=True, concatenatedPngObservations=True, compressedChannelMapping=True,
            hybridActions=True, trainingAnalytics=True, variableLengthObservation=True, multiAgentGroups=True))
        for t in TEAMS:
            spec = ActionSpecProto(num_continuous_actions=self.args.continuous,
                                   num_discrete_actions=len(self.args.branches),
                                   discrete_branch_sizes=list(self.args.branches))
            init.brain_parameters.append(BrainParametersProto(brain_name=behaviour(t), is_training=True,
                                                              action_spec=spec))
        return message


def parse(argv: list[str]):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mlagents-port", type=int, required=True)
    parser.add_argument("--fields", type=int, default=2)
    parser.add_argument("--episode-length", type=int, default=5)
    parser.add_argument("--decision-period", type=int, default=1)
    parser.add_argument("--branches", type=lambda s: tuple(int(v) for v in s.split(",") if v), default=(3, 3, 3))
    parser.add_argument("--continuous", type=int, default=0)
    parser.add_argument("--image", type=lambda s: tuple(int(v) for v in s.split("x")), default=None)
    parser.add_argument("--png", action="store_true")
    parser.add_argument("--no-vector", action="store_true")
    parser.add_argument("--no-group-ids", action="store_true")
    parser.add_argument("--regroup-after", type=int, default=None)
    parser.add_argument("--obs-offset", type=lambda s: {int(s.split(":")[0]): float(s.split(":")[1])}, default={})
    parser.add_argument("--log", default=None)
    parser.add_argument("--side-log", default=None)
    parser.add_argument("--die-after", type=int, default=None)
    parser.add_argument("--hang-after", type=int, default=None)
    parser.add_argument("--never-connect", action="store_true")
    parser.add_argument("--start-delay", type=float, default=0.0)
    parser.add_argument("--fault-once", default=None)
    args, _unity_flags = parser.parse_known_args(argv)  # -batchmode, -nographics, -logFile ... as a player gets
    return args


def claim_fault(path: str | None) -> bool:
    """Whether this launch is the one to fail: always without ``--fault-once``, else the first to
    create ``path``."""
    if path is None:
        return True
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.never_connect:
        while True:
            time.sleep(60)
    time.sleep(args.start_delay)
    scene = Scene(args)
    channel = grpc.insecure_channel(f"localhost:{args.mlagents_port}")
    grpc.channel_ready_future(channel).result(timeout=60)
    exchange = UnityToExternalProtoStub(channel).Exchange
    exchange(scene.initialization())             # answered by the trainer's initialization input
    reply = exchange(UnityMessageProto(header={"status": 200}))   # answered by the first command
    while True:
        if reply.header.status != 200:
            return 0
        if args.side_log and reply.unity_input.rl_input.side_channel:
            with open(args.side_log, "a") as side_log:
                for message in side_channel_messages(reply.unity_input.rl_input.side_channel):
                    side_log.write(json.dumps(message) + "\n")
        command = reply.unity_input.rl_input.command
        if command == QUIT:
            return 0
        if command == RESET:
            message = scene.answer(scene.reset())
        elif command == STEP:
            if args.die_after is not None and scene.steps >= args.die_after and claim_fault(args.fault_once):
                os._exit(3)
            if args.hang_after is not None and scene.steps >= args.hang_after and claim_fault(args.fault_once):
                while True:
                    time.sleep(60)
            message = scene.answer(scene.step(reply.unity_input.rl_input.agent_actions))
        else:
            return f"standin: unknown command {command}"
        reply = exchange(message)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except grpc.RpcError:  # the trainer went away: a player quits too
        sys.exit(0)
