"""Pre-start checks: the config against the world, before Ray or any actor starts.

A bad input found here stops ``relayrl train`` (and ``relayrl eval``) with one ``ConfigError`` line
naming the field and the fix, instead of a task error on every replica and retry.
``controller.driver.train`` runs them in this order (``monitor.evaluate.evaluate`` runs the first
two, model first)::

    resolve_rewards         every reward function imports and builds (rewards, reward.sandbox)
    resolve_model_path      model.path resolves to a local model directory, then:
      check_context           trainer.tp_size divides its heads, and its layers and vocabulary split
                              (trainer.tp.check_model); model.max_model_len is within its
                              positions and above rollout.max_tokens
        check_kv_cache        rollout.kv_cache_gb holds one model.max_model_len sequence
      check_data              the dataset loads and has rows
        check_rows            every row's max_tokens column is a budget >= rollout.min_tokens, and
                              every prompt, formatted, leaves rollout.max_tokens in the context; the
                              held-out prompts of eval.every too

(``relayrl eval`` runs ``check_rows`` on the rows it scores.) What the
config alone decides is checked earlier, when it loads (``relayrl.config``: each field in its
section's ``__post_init__``, the rules that span sections in ``validate``); the checks here need
the model's files, its tokenizer, the dataset's rows or the reward functions themselves. The resume
point (``run.resume``) is looked up by the driver itself, beside the run directory it reopens.

Why a top-level module and not ``controller/``: ``relayrl eval`` (``monitor/evaluate.py``) runs
these checks too, and importing them from the controller closed a circle (driver -> scheduler ->
evaluation -> monitor/evaluate -> driver). The models, data, rewards and trainer imports stay
inside the functions, as they were in the driver (``trainer.tp`` imports torch; ``rewards`` imports
monitor and trainer modules), so importing this module adds only ``relayrl.config`` to its
importer's graph.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from relayrl.config import FILE_TASKS, Config, ConfigError


def resolve_rewards(cfg: Config, rewards: list[Callable] | None) -> list[tuple[str, Callable, float]]:
    """``[(name, fn, weight)]`` from callables given to ``train`` or from the recipe's import paths."""
    from relayrl.rewards import load_reward_fns

    if rewards:
        return [(getattr(fn, "__name__", f"reward{i}"), fn, 1.0) for i, fn in enumerate(rewards)]
    try:
        return load_reward_fns([(spec.fn, spec.weight, spec.kwargs) for spec in cfg.rewards], cfg.reward.sandbox)
    except ValueError as exc:
        raise ConfigError(f"rewards: {exc}") from None


def resolve_model_path(cfg: Config) -> Path:
    """The model directory, checked against the config: context length, and a non-empty dataset."""
    from relayrl.models import resolve_model

    try:
        path = resolve_model(cfg.model.path)
    except (ValueError, FileNotFoundError, ImportError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    check_context(cfg, path)
    check_data(cfg, path)
    return path


def check_context(cfg: Config, path: Path) -> None:
    """``model.max_model_len`` within the model's positions, room for a prompt beside ``max_tokens``,
    a model that ``trainer.tp_size`` splits (heads, layer plan, vocabulary), and layers that the pipeline stages
    divide."""
    from relayrl.trainer.tp import check_model

    model_config = json.loads((Path(path) / "config.json").read_text())
    if cfg.trainer.tp_size > 1:
        try:
            check_model(str(path), cfg.trainer.tp_size)
        except ValueError as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
    stages = cfg.trainer.pp_size * cfg.trainer.pp_virtual_stages
    layers = model_config.get("num_hidden_layers")
    if stages > 1 and layers and layers % stages:
        raise ConfigError(
            f"the model's {layers} layers do not split into trainer.pp_size x trainer.pp_virtual_stages = {stages} "
            "equal pipeline stages; choose sizes whose product divides the layers"
        )
    positions = model_config.get("max_position_embeddings")
    if positions and cfg.model.max_model_len > positions:
        raise ConfigError(
            f"model.max_model_len={cfg.model.max_model_len} exceeds the model's context "
            f"({positions} positions); set model.max_model_len<={positions}"
        )
    if cfg.rollout.max_tokens >= cfg.model.max_model_len:
        raise ConfigError(
            f"rollout.max_tokens={cfg.rollout.max_tokens} leaves no room for the prompt in "
            f"model.max_model_len={cfg.model.max_model_len}; lower max_tokens or raise max_model_len"
        )
    check_kv_cache(cfg, model_config)


def check_kv_cache(cfg: Config, model_config: dict) -> None:
    """``rollout.kv_cache_gb`` holds at least one ``model.max_model_len`` sequence, which vLLM requires at
    engine start (it would fail there, after Ray and the actors started, naming its own memory knobs).
    Per token and engine worker: K and V for each of its layers' KV heads, ``rollout.tp_size`` sharing the heads
    and ``rollout.pp_size`` the layers (the first workers take the extra ones)."""
    try:
        layers, heads = model_config["num_hidden_layers"], model_config["num_attention_heads"]
        kv_heads = model_config.get("num_key_value_heads") or heads
        head_dim = model_config.get("head_dim") or model_config["hidden_size"] // heads
    except KeyError:
        return  # a layout this check does not know: vLLM's own check stands
    itemsize = 2 if cfg.model.dtype == "bfloat16" else 4  # model.dtype is float32 or bfloat16 (checked)
    per_token = 2 * -(-layers // cfg.rollout.pp_size) * max(1, kv_heads // cfg.rollout.tp_size) * head_dim * itemsize
    need_gb = per_token * cfg.model.max_model_len / 2**30
    if need_gb > cfg.rollout.kv_cache_gb:
        raise ConfigError(
            f"rollout.kv_cache_gb={cfg.rollout.kv_cache_gb} is less than one "
            f"model.max_model_len={cfg.model.max_model_len} sequence of this model's KV cache "
            f"({need_gb:.3f} GB); raise rollout.kv_cache_gb or lower model.max_model_len"
        )


def check_data(cfg: Config, model_path: Path) -> None:
    """Load the prompts once before Ray starts: a malformed row, an empty dataset or a prompt too long for
    the engine fails here, in one line, instead of as a task error on every replica and retry."""
    from relayrl.data import load_task

    try:
        rows = load_task(cfg.data)
    except (ValueError, FileNotFoundError) as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    if not rows:
        raise ConfigError(
            f"the dataset ({cfg.data.task}{': ' + cfg.data.path if cfg.data.path else ''}) has "
            "no rows; point data.path at a non-empty dataset"
        )
    check_rows(cfg, model_path, rows, _data_source(cfg))
    if cfg.eval.every:  # the held-out prompts evaluated during training: a bad one would stop the run at step 0
        from relayrl.data.eval_split import eval_rows

        try:
            held, where = eval_rows(cfg, cfg.eval.train_prompts)
        except (ValueError, FileNotFoundError) as exc:
            raise ConfigError(str(exc).splitlines()[0]) from None
        check_rows(cfg, model_path, held, where)


def check_rows(cfg: Config, model_path: Path, rows: list[dict], source: str) -> None:
    """Each row's ``max_tokens`` budget (``data.lengths.check_row_budgets``) and its prompt's length
    (``check_prompt_lengths``); ``source`` names the rows in the error."""
    from relayrl.data.lengths import check_row_budgets

    try:
        check_row_budgets(rows, cfg.rollout.min_tokens)
    except ValueError as exc:
        raise ConfigError(f"{source} {exc}") from None
    check_prompt_lengths(cfg, model_path, rows, source)


def _data_source(cfg: Config) -> str:
    """How an error names the dataset: the file's path, or the generated task."""
    return f"{cfg.data.path}" if cfg.data.task in FILE_TASKS else f"data.task={cfg.data.task}"


def check_prompt_lengths(cfg: Config, model_path: Path, rows: list[dict], source: str) -> None:
    """Every prompt, formatted as the sampler formats it, must leave ``rollout.max_tokens`` of room in
    ``model.max_model_len`` (vLLM rejects a prompt that fills the context and cuts completions that run
    into it). Files: every row; generated tasks: the longest distinct questions (``MAX_GENERATED_CHECKED``).
    A multi-turn environment's ``reset`` may add text; the episode runner checks that part at run time.
    ``source`` names the rows in the error."""
    from relayrl.data.lengths import MAX_GENERATED_CHECKED, longest_prompt
    from relayrl.data.sampler import chat_formatter
    from relayrl.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    try:
        format_prompt = chat_formatter(tokenizer, cfg.data.chat_template)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    limit = None if cfg.data.task in FILE_TASKS else MAX_GENERATED_CHECKED
    found = longest_prompt(rows, tokenizer, format_prompt, limit)
    budget = cfg.model.max_model_len - cfg.rollout.max_tokens
    if found.tokens > budget:
        raise ConfigError(
            f"{source} row {found.row} ({found.question[:40]!r}...) is {found.tokens} prompt tokens; with "
            f"rollout.max_tokens={cfg.rollout.max_tokens} it needs model.max_model_len>="
            f"{found.tokens + cfg.rollout.max_tokens} (now {cfg.model.max_model_len}): raise "
            f"model.max_model_len, lower rollout.max_tokens or shorten that row"
        )
