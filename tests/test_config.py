"""Config resolution: precedence, typing, and the errors users see for bad input."""
import pytest
import yaml

from marlkit.api import build_config
from marlkit.config import ConfigError, from_dict, parse_set
from marlkit.errors import UnknownNameError


def test_precedence_defaults_yaml_config_file_set(tmp_path):
    cfg = build_config("MAPPO", "mpe_spread")
    assert cfg.runner.parallels == 16            # from mpe_spread.yaml (dataclass default is also 16)
    assert cfg.agents["MAPPO"].lr == pytest.approx(7e-4)
    assert cfg.agents["MAPPO"].gamma == pytest.approx(0.99)  # dataclass default, not in the YAML
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"runner": {"parallels": 4, "horizon": 50}, "agents": {"MAPPO": {"lr": 1e-3}}}))
    cfg = build_config("MAPPO", "mpe_spread", config=str(extra), **{"runner.parallels": 8})
    assert cfg.runner.parallels == 8             # --set beats --config
    assert cfg.runner.horizon == 50              # --config beats the env YAML
    assert cfg.agents["MAPPO"].lr == pytest.approx(1e-3)
    assert cfg.env.kwargs["N"] == 3              # untouched env YAML keys survive the merge


def test_set_values_are_typed():
    parsed = parse_set(["runner.parallels=8", "agents.MAPPO.lr=3e-4", "agents.MAPPO.actor.hidden_sizes=[32, 32]",
                        "runner.progress=false"])
    cfg = build_config("MAPPO", "mpe_spread", **{k: v for k, v in _flatten(parsed).items()})
    assert cfg.runner.parallels == 8 and isinstance(cfg.runner.parallels, int)
    assert cfg.agents["MAPPO"].lr == pytest.approx(3e-4)   # YAML reads "3e-4" as a string; it is coerced
    assert cfg.agents["MAPPO"].actor.hidden_sizes == [32, 32]
    assert cfg.runner.progress is False


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_unknown_agent_lists_valid_names():
    with pytest.raises(UnknownNameError) as err:
        build_config("MAPOO", "mpe_spread")
    assert "'MAPOO'" in str(err.value) and "did you mean 'MAPPO'" in str(err.value) and "IPPO" in str(err.value)


def test_unknown_env_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        build_config("MAPPO", "mpe_sprad")
    assert "did you mean 'mpe_spread'" in str(err.value) and "valid envs" in str(err.value)


@pytest.mark.parametrize("key,value,expected", [
    ("runner.paralels", 4, "unknown key 'runner.paralels' (did you mean 'parallels'?)"),
    ("agents.MAPPO.learning_rate", 0.1, "unknown key 'agents.MAPPO.learning_rate'"),
    ("env.facotry", "x:y", "did you mean 'factory'"),
    ("runner.parallels", "many", "runner.parallels: expected an integer, got 'many'"),
    ("runner.parallels", 0, "runner.parallels: 0 is below the minimum 1"),
    ("agents.MAPPO.gamma", 1.5, "agents.MAPPO.gamma: 1.5 is above the maximum 1.0 (allowed: 0.0 to 1.0)"),
    ("runner.vectorize", "threads", "runner.vectorize: 'threads' is not allowed; choose one of 'sync', 'subprocess', 'auto'"),
    ("agents.MAPPO.value_norm", "maybe", "expected true or false"),
    ("agents.MAPPO.actor.hidden_sizes", 64, "expected a list"),
])
def test_bad_keys_types_and_ranges_name_the_key(key, value, expected):
    with pytest.raises(ConfigError) as err:
        build_config("MAPPO", "mpe_spread", **{key: value})
    assert expected in str(err.value)


def test_unknown_agent_section_in_yaml(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"agents": {"IPOP": {"lr": 1e-3}}}))
    with pytest.raises(ConfigError, match="agents.IPOP: unknown agent 'IPOP'"):
        build_config("MAPPO", "mpe_spread", config=str(extra))


def test_bad_set_syntax_and_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_set(["runner.parallels"])
    with pytest.raises(ConfigError, match="does not exist"):
        build_config("MAPPO", "mpe_spread", config=str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="does not exist"):
        build_config("MAPPO", str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        build_config("MAPPO", str(bad))


def test_bad_factory_is_reported_before_training(env_yaml, tiny):
    import marlkit
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        marlkit.run(env=env_yaml("no_such_module:make"), **tiny)
    with pytest.raises(ConfigError, match="must look like 'package.module:function'"):
        marlkit.run(env=env_yaml("toy_envs.scripted"), **tiny)
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        marlkit.run(env=env_yaml("toy_envs:nope"), **tiny)


def test_bad_device_is_named(tiny):
    import marlkit
    import torch
    with pytest.raises(ConfigError, match="device: 'banana' is not a torch device"):
        marlkit.run(agent="MAPPO", env="mpe_spread", device="banana", **tiny)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device: 'cuda' was asked for but CUDA is not available"):
            marlkit.run(agent="MAPPO", env="mpe_spread", device="cuda", **tiny)


def test_packaged_profile_via_config():
    cfg = build_config("MAPPO", "mpe_spread", config="fast")
    assert cfg.runner.parallels == 64 and cfg.agents["MAPPO"].epochs == 5
    assert cfg.agents["MAPPO"].lr == pytest.approx(7e-4)      # the rest still comes from mpe_spread.yaml
    with pytest.raises(ConfigError, match="--config 'fats': no such file, and no packaged profile of that name "
                                          "\\(did you mean 'fast'\\?\\)"):
        build_config("MAPPO", "mpe_spread", config="fats")
    bound = build_config("MAPPO", "mpe_spread", config="update_bound")
    assert (bound.runner.overlap, bound.runner.update_threads, bound.runner.torch_threads) == (False, 2, 1)
    assert not bound.runner.overlapped() and bound.runner.envs_in_workers()


def _threads(cfg):
    return cfg.runner.overlapped(), cfg.runner.update_threads


@pytest.mark.parametrize("sets, expected", [
    ([], (True, None)),                                                   # mlps: collection beside the update
    (["agents.MAPPO.actor.name=cnn"], (False, 2)),                        # convolutions: the update alone, 2 threads
    (["agents.MAPPO.critic={name: gru, kwargs: {encoder: cnn}}"], (False, 2)),
    (["agents.MAPPO.actor.name=mixed"], (False, 2)),
    (["agents.MAPPO.actor.name=cnn", "runner.overlap=true"], (True, None)),   # what the config says stays
    (["agents.MAPPO.actor.name=cnn", "runner.update_threads=1"], (False, 1)),
    (["agents.MAPPO.actor.name=cnn", "runner.torch_threads=2"], (False, None)),
    (["agents.IPPO.actor.name=cnn"], (True, None)),                       # a section this run does not use
    (["agents.IPPO.actor.name=cnn", "groups.agents.agent=IPPO"], (False, 2)),     # a group's own agent
    (["agents.IPPO.actor.name=cnn", "groups.agents.agent=IPPO", "groups.agents.train=false"], (True, None)),
    (["agents.MAPPO.actor={name: gru, kwargs: {encoder: mlp}}"], (True, None)),
])
def test_a_run_that_learns_with_convolutions_updates_alone_on_two_threads(sets, expected):
    cfg = build_config("MAPPO", "mpe_spread", overrides=parse_set(sets))
    assert _threads(cfg) == expected


def test_packaged_image_envs_keep_the_settings_they_were_measured_with(tmp_path):
    coop = build_config("MAPPO", "doom_coop")
    assert _threads(coop) == (True, None) and coop.runner.overlap is True
    # its match workers act, except where the runner must: Ray actors, or double-buffered collection
    assert coop.runner.acts_in_workers()
    for sets in (["runner.vectorize=ray"], ["runner.double_buffer=true"]):
        assert not build_config("MAPPO", "doom_coop", overrides=parse_set(sets)).runner.acts_in_workers()
    assert _threads(build_config("MAPPO", "mettagrid")) == (False, 2)   # its CNNs, in process
    # resolved once, where the run begins: its config.yaml holds the values
    bound = build_config("MAPPO", "mpe_spread", overrides=parse_set(["agents.MAPPO.actor.name=cnn"]))
    assert (bound.to_dict()["runner"]["overlap"], bound.to_dict()["runner"]["update_threads"]) == (False, 2)
    # a run dir's config is taken as it is: a run saved with nulls (before this default) resumes
    # with the overlap it was started with
    saved = bound.to_dict()
    saved["runner"].update(overlap=None, update_threads=None)
    assert _threads(from_dict(saved)) == (True, None)


def test_an_env_yaml_builds_on_the_env_its_base_names(tmp_path):
    cfg = build_config("MAPPO", "doom_deathmatch")
    assert cfg.env.scenario == "deathmatch.cfg" and len(cfg.env.buttons) == 7 and cfg.env.respawn
    assert cfg.env.reward.ammo == 0.0                                  # its own
    assert cfg.env.reward.damage == pytest.approx(0.01) and cfg.env.reward.deaths == pytest.approx(-1.0)
    assert cfg.env.frame_stack == 4 and cfg.runner.parallels == 4    # from doom_coop.yaml, its base
    assert cfg.agents["MAPPO"].actor.name == "cnn"
    alias, coop = build_config("MAPPO", "doom_defend"), build_config("MAPPO", "doom_coop")
    assert alias.env == coop.env and alias.runner == coop.runner       # a name kept for old commands
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({"base": "mpe_spread", "env": {"kwargs": {"N": 4}}}))
    cfg = build_config("MAPPO", str(mine))
    assert cfg.env.kwargs == {"N": 4, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": False}
    assert cfg.env_name == "mine"


def test_a_bad_or_circular_base_names_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text(yaml.safe_dump({"base": "b.yaml"}))
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"base": "a.yaml"}))
    with pytest.raises(ConfigError, match=r"b.yaml: base: 'a.yaml' leads back"):
        build_config("MAPPO", str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"base": "mpe_spred"}))
    with pytest.raises(ConfigError, match="unknown env 'mpe_spred'.*mpe_spread"):
        build_config("MAPPO", str(tmp_path / "c.yaml"))


def test_a_bad_base_names_the_file_that_set_it(tmp_path):
    path = tmp_path / "mine.yaml"
    for base, says in (("mpe_sprad", "unknown env 'mpe_sprad' (did you mean 'mpe_spread'?)"),
                       ("nothere.yaml", "nothere.yaml' does not exist (a path is relative to this file)")):
        path.write_text(yaml.safe_dump({"base": base}))
        with pytest.raises(ConfigError) as err:
            build_config("MAPPO", str(path))
        assert str(err.value).startswith(f"{path}: base: ") and says in str(err.value)


def test_per_agent_settings_hold_only_for_their_agent(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"base": "mpe_spread", "per_agent": {
        "MAT": {"runner": {"parallels": 64}, "agents": {"MAT": {"clip": 0.05}}}}}))
    mat = build_config("MAT", str(path))
    assert mat.runner.parallels == 64 and mat.agents["MAT"].clip == 0.05
    assert build_config("MAPPO", str(path)).runner.parallels == 16          # mpe_spread's own
    assert build_config("MAT", str(path), **{"runner.parallels": 8}).runner.parallels == 8   # --set wins
    path.write_text(yaml.safe_dump({"base": "mpe_spread", "per_agent": {"MAT": 64}}))
    with pytest.raises(ConfigError, match="mine.yaml: per_agent: expected agent name -> settings"):
        build_config("MAT", str(path))
    path.write_text(yaml.safe_dump({"base": "mpe_spread", "per_agent": {"MTA": {"runner": {"parallels": 64}}}}))
    with pytest.raises(ConfigError, match=r"mine.yaml: per_agent.MTA: unknown agent 'MTA' \(did you mean 'MAT'"):
        build_config("MAPPO", str(path))


@pytest.mark.parametrize("players", [1, 9])
def test_a_doom_coop_match_refuses_a_player_count_its_network_game_cannot_take(players):
    """A co-op match is a host and players joining it: one player is no co-op, and ZDoom's network
    game takes 8 at most; refused before any engine starts, naming the range."""
    with pytest.raises(ConfigError, match=rf"env.players: {players} is (below|above) the .* \(allowed: 2 to 8\)"):
        build_config("MAPPO", "doom_coop", **{"env.players": players})
