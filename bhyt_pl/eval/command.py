"""``python -m bhyt_pl eval``: lm-evaluation-harness and perplexity on a bhyt_pl checkpoint.

Examples::

    # the paper's suite (docs/method.md, section 6): 3-shot, eight multiple-choice tasks (needs the Hub datasets)
    python -m bhyt_pl eval --ckpt_path runs/tiny-bhyt/version_0/checkpoints/last.ckpt
    # the embedded offline suite (bhyt_pl.eval.tasks), or any directory of local task YAMLs
    python -m bhyt_pl eval --ckpt_path last.ckpt --include_path embedded
    python -m bhyt_pl eval --ckpt_path last.ckpt --include_path my_tasks/ --tasks my_task --limit 100
    # after SFT: chat template, C4 and WikiText-2 perplexity (local files offline)
    python -m bhyt_pl eval --ckpt_path sft.ckpt --chat_template --perplexity c4 wikitext2 \\
        --ppl_data_files c4=c4-validation.00000-of-00008.json.gz wikitext2=wiki.test.raw

One process evaluates everything, on one ``--device``: the command has no data-parallel mode (lm-eval would have
every launched process score every example and write the same files), so launched as one of several processes
(``WORLD_SIZE`` > 1, as torchrun sets it) it stops before any work with one error line.

Results: lm-eval's table on stdout, ``<checkpoint>.eval.json`` beside the checkpoint (``--output_path``),
and ``eval/<task>/<metric>`` / ``eval/ppl/<source>/token_perplexity`` scalars in the run's TensorBoard
log (the checkpoint's own ``version_N`` folder; for the older ``<run>/checkpoints/`` layout the newest
``version_N`` beside it; or ``--tensorboard_dir``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from bhyt_pl.errors import UsageError

__all__ = ["PAPER_TASKS", "build_parser", "main", "tensorboard_scalars"]

log = logging.getLogger(__name__)

PAPER_TASKS = ("arc_challenge", "arc_easy", "piqa", "hellaswag", "openbookqa", "winogrande", "mmlu", "boolq")
"""The paper's lm-eval suite, evaluated 3-shot (docs/method.md, section 6)."""
EMBEDDED = "embedded"


def _limit(value: str) -> int | float:
    number = float(value)
    return int(number) if number >= 1 and number.is_integer() else number


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bhyt_pl eval",
        allow_abbrev=False,  # a shortened flag is an error, never read as the flag it starts
        description="Evaluate a bhyt_pl LlamaLM checkpoint (any norm scheme) with lm-evaluation-harness and "
        "token-level perplexity.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--ckpt_path", required=True, help="Single-file LlamaLM checkpoint (.ckpt).")
    p.add_argument(
        "--tasks",
        default=None,
        help="Comma-separated lm-eval tasks or groups; 'none' for perplexity only. Default: the paper's suite "
        f"({','.join(PAPER_TASKS)}), or the '{EMBEDDED}' suite's group with --include_path {EMBEDDED}.",
    )
    p.add_argument("--num_fewshot", type=int, default=3, help="Few-shot examples (tasks that fix 0 keep 0).")
    p.add_argument(
        "--include_path",
        default=None,
        help="Directory of local task YAMLs (absolute data_files), or 'embedded' for the bundled offline suite. "
        "Only this directory is indexed when it holds every requested task; otherwise lm-eval's tasks too.",
    )
    p.add_argument("--limit", type=_limit, default=None, help="Examples per task (a fraction if < 1); for testing.")
    p.add_argument("--batch_size", type=int, default=16, help="Sequences per forward pass.")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu, cuda, cuda:1.")
    p.add_argument("--dtype", default=None, help="Cast the model, e.g. bfloat16 (default: as saved).")
    p.add_argument("--tokenizer", default=None, help="Tokenizer name/path (default: the checkpoint's).")
    p.add_argument("--max_length", type=int, default=None, help="Longest input (default: config.max_seq_len).")
    p.add_argument(
        "--chat_template",
        action="store_true",
        help="Render prompts with the chat template the LIMA data module trains with (for SFT checkpoints); "
        "few-shot examples become user/assistant turns.",
    )
    p.add_argument("--system_prompt", default=None, help="System turn of the chat template.")
    p.add_argument(
        "--perplexity",
        nargs="*",
        default=[],
        choices=["c4", "wikitext2"],
        help="Token-level perplexity sources (Hub: allenai/c4 en validation, Salesforce/wikitext-2-raw-v1 test).",
    )
    p.add_argument(
        "--ppl_data_files",
        nargs="*",
        default=[],
        metavar="SOURCE=PATH",
        help="Local files per source (offline), e.g. c4=/data/c4-validation.json.gz wikitext2=/data/wiki.test.raw; "
        "c4=embedded is the bundled corpus.",
    )
    p.add_argument("--ppl_max_documents", type=int, default=1000, help="First N C4 validation documents.")
    p.add_argument("--ppl_max_length", type=int, default=None, help="Window (default: max_length).")
    p.add_argument("--ppl_stride", type=int, default=None, help="New tokens per window (default: window / 2).")
    p.add_argument("--output_path", default=None, help="Results JSON (default: <checkpoint>.eval.json beside it).")
    p.add_argument(
        "--tensorboard_dir",
        default="auto",
        help="Where to add eval scalars: 'auto' (the checkpoint's version_N; the run's newest in the older layout), "
        "'none', or a directory.",
    )
    p.add_argument("--bootstrap_iters", type=int, default=100000, help="lm-eval bootstrap iterations for stderr.")
    p.add_argument("--seed", type=int, default=1234, help="lm-eval's random, numpy, torch and few-shot seed.")
    return p


def _resolve_tasks(args: argparse.Namespace, workdir: Path) -> tuple[list[str], Any]:
    """Task names and the ``TaskManager`` that knows them (local-only when it can be)."""
    from lm_eval.tasks import TaskManager

    include = args.include_path
    if include == EMBEDDED:
        from bhyt_pl.eval.tasks import EMBEDDED_GROUP, write_embedded_suite

        include = str(write_embedded_suite(workdir / "embedded_tasks"))
        default: list[str] = [EMBEDDED_GROUP]
    else:
        default = list(PAPER_TASKS)
        if include is not None and not Path(include).is_dir():
            raise FileNotFoundError(f"--include_path {include!r} is not a directory (or use 'embedded')")
    if args.tasks is None:
        tasks = default
    elif args.tasks.strip().lower() == "none":
        return [], None
    else:
        tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if include is not None:
        local = TaskManager(include_path=include, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return tasks, local
    manager = TaskManager(include_path=include)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"unknown lm-eval task(s) {unknown}; see `lm-eval ls tasks` or pass --include_path")
    return tasks, manager


def _ppl_files(pairs: list[str]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for pair in pairs:
        source, sep, path = pair.partition("=")
        if not sep or not path:
            raise ValueError(f"--ppl_data_files takes SOURCE=PATH pairs, got {pair!r}")
        files.setdefault(source, []).append(path)
    return files


def tensorboard_scalars(results: dict[str, Any]) -> dict[str, float]:
    """``eval/<task>/<metric>`` scalars from an lm-eval results dict plus our ``perplexity`` entry."""
    scalars: dict[str, float] = {}
    for section in ("results", "groups"):
        for task, metrics in (results.get(section) or {}).items():
            for key, value in metrics.items():
                metric, _, filt = key.partition(",")
                if metric.endswith("_stderr") or metric == "alias" or not isinstance(value, (int, float)):
                    continue
                name = metric if filt in ("", "none") else f"{metric}_{filt}"
                scalars[f"eval/{task}/{name}"] = float(value)
    for source, ppl in (results.get("perplexity") or {}).items():
        scalars[f"eval/ppl/{source}/token_perplexity"] = float(ppl["token_perplexity"])
    return scalars


def _tensorboard_dir(choice: str, ckpt_path: Path) -> Path | None:
    if choice.lower() == "none":
        return None
    if choice != "auto":
        return Path(choice)
    from bhyt_pl.runs import checkpoint_run_version

    if checkpoint_run_version(ckpt_path) is not None:  # <runs_dir>/<run_name>/version_N/checkpoints/<file>.ckpt
        return ckpt_path.resolve().parent.parent
    run_dir = ckpt_path.resolve().parent.parent  # the older layout <runs_dir>/<run_name>/checkpoints/<file>.ckpt
    versions = [p for p in run_dir.glob("version_*") if p.is_dir() and p.name.removeprefix("version_").isdigit()]
    return max(versions, key=lambda p: int(p.name.removeprefix("version_"))) if versions else None


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation; returns the process exit code.

    Raises:
        UsageError: the process is one of several (``WORLD_SIZE`` > 1): the evaluation runs on one process.
    """
    args = build_parser().parse_args(argv)
    world_size = os.environ.get("WORLD_SIZE", "1")
    if world_size.strip().isdigit() and int(world_size) > 1:
        raise UsageError(
            f"python -m bhyt_pl eval runs on one process, but this one was launched as one of WORLD_SIZE={world_size} "
            "(by torchrun or another launcher): run it without the launcher, and pick the GPU with --device"
        )
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    import lm_eval
    from lm_eval.utils import handle_non_serializable, make_table

    from bhyt_pl.checkpoint import read_checkpoint
    from bhyt_pl.data.chat import ChatTemplate
    from bhyt_pl.eval.lm import BHyTLM
    from bhyt_pl.eval.perplexity import load_texts, perplexity

    ckpt_path = Path(args.ckpt_path)
    lm = BHyTLM.from_checkpoint(
        ckpt_path,
        tokenizer=args.tokenizer,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        max_length=args.max_length,
        chat_template=ChatTemplate(system=args.system_prompt),
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bhyt_eval_") as tmp:
        tasks, manager = _resolve_tasks(args, Path(tmp))
        if tasks:
            results = lm_eval.simple_evaluate(
                model=lm,
                tasks=tasks,
                num_fewshot=args.num_fewshot,
                limit=args.limit,
                task_manager=manager,
                apply_chat_template=args.chat_template,
                fewshot_as_multiturn=args.chat_template,
                bootstrap_iters=args.bootstrap_iters,
                log_samples=False,
                random_seed=args.seed,
                numpy_random_seed=args.seed,
                torch_random_seed=args.seed,
                fewshot_random_seed=args.seed,
            )
            print(make_table(results))
            if results.get("groups"):
                print(make_table(results, "groups"))
    files = _ppl_files(args.ppl_data_files)
    unknown = sorted(set(files) - set(args.perplexity))
    if unknown:
        raise ValueError(f"--ppl_data_files names source(s) {unknown} not in --perplexity {args.perplexity}")
    if args.perplexity:
        results["perplexity"] = {}
    for source in args.perplexity:
        texts = load_texts(source, files.get(source), args.ppl_max_documents)
        result = perplexity(
            lm.model, lm.tok, texts, args.ppl_max_length or lm.max_length, args.ppl_stride, args.batch_size
        )
        results["perplexity"][source] = result.to_dict()
        print(
            f"perplexity {source}: {result.perplexity:.4f} over {result.tokens} tokens in {result.documents} "
            f"document(s) (window {result.max_length}, stride {result.stride})"
        )
    if not results:
        raise ValueError("nothing to evaluate: --tasks none and no --perplexity source")

    meta = read_checkpoint(ckpt_path, mmap=True)
    results["checkpoint"] = {
        "path": str(ckpt_path.resolve()),
        "global_step": meta.get("global_step"),
        "norm": lm.model.config.norm,
        "chat_template": args.chat_template,
    }
    output = Path(args.output_path) if args.output_path else ckpt_path.with_name(f"{ckpt_path.stem}.eval.json")
    output.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n")
    print(f"results: {output}")

    tb_dir = _tensorboard_dir(args.tensorboard_dir, ckpt_path)
    if tb_dir is not None:
        from torch.utils.tensorboard import SummaryWriter

        step = int(meta.get("global_step") or 0)
        with SummaryWriter(str(tb_dir)) as writer:
            for name, value in tensorboard_scalars(results).items():
                writer.add_scalar(name, value, step)
        print(f"tensorboard: eval scalars at step {step} in {tb_dir}")
    return 0
