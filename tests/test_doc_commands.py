"""
Every shell command in a fenced block of README.md or docs/*.md is either run by a test or by `.ci/run` (COVERED
names which), or tagged in a shell comment as something CI cannot run: `[GPU only]`, `[cluster only]` or
`[needs the package index]`. The tag goes at the end of the command's line or on the nearest comment line above it
in the same block. A new command without either fails here, naming the page and line.
"""

import ast
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "shell", "console")
TAGS = ("GPU only", "cluster only", "needs the package index")
TAG = re.compile(r"\[(" + "|".join(re.escape(tag) for tag in TAGS) + r")\]")

# command (as written, comment dropped, whitespace collapsed) -> where it runs: "tests/<file>::<test>" or ".ci/run"
COVERED: dict[str, tuple[str, ...]] = {
    # README: install into an existing TRL project (placeholders replaced by a local clone, its git URL, the wheel)
    'pip install "./dapo-trl[plot]"': ("tests/test_install.py::test_readme_install_commands_work_as_written",),
    'pip install "dapo-trl[plot] @ git+<repository URL>@<tag or commit>"': (
        "tests/test_install.py::test_readme_install_commands_work_as_written",
    ),
    "pip wheel --no-deps --wheel-dir dist ./dapo-trl": (
        "tests/test_install.py::test_readme_install_commands_work_as_written",
    ),
    'pip install "dist/dapo_trl-0.1.0-py3-none-any.whl[plot]"': (
        "tests/test_install.py::test_readme_install_commands_work_as_written",
    ),
    # README: the two set-up commands. `make demo` = its install line (checked) + the embedded default (run)
    "make demo": (
        "tests/test_train_math.py::test_make_demo_installs_what_the_demo_needs",
        "tests/test_train_math.py::test_cpu_demo_learns",
    ),
    "make test": (".ci/run",),
    # docs/vllm.md, docs/benchmarks.md: the vllm tier's environment and tests (.ci/run), the recipe and benchmark on it
    "make vllm-env": (".ci/run",),
    "make test-vllm": (".ci/run",),
    "VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_NUM_OF_RESERVED_CPU=0 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_CI_ENV=1 "
    ".venv-vllm/bin/python examples/train_math.py --config configs/smollm2_cpu.yaml --use_vllm true "
    "--vllm_mode colocate": (
        "tests/test_vllm.py::test_the_smollm2_recipe_trains_through_vllm_from_the_warmed_up_weights",
    ),
    ".venv-vllm/bin/python benchmarks/vllm_speed.py --model /path/to/SmolLM2-135M-Instruct --completions 32 "
    "--max-tokens 64 --steps 1 --step-tokens 32": ("tests/test_vllm.py::test_the_speed_benchmark_prints_both_ratios",),
    "python -m dapo_trl.evaluation --model outputs/cpu-demo --dataset outputs/cpu-demo/heldout.jsonl": (
        "tests/test_train_math.py::test_demo_run_is_reproduced_by_the_evaluation_cli",
        "tests/test_train_math.py::test_cpu_demo_learns",
    ),
    # the main job
    "accelerate launch examples/train_math.py": ("tests/test_train_math.py::test_cpu_demo_learns",),
    "accelerate launch examples/train_math.py --max_steps 20": (
        "tests/test_train_math.py::test_demo_with_a_flag_trains_on_cpu_with_the_demo_values",
    ),
    "accelerate launch examples/train_math.py --config configs/smoke.yaml": (
        "tests/test_train_math.py::test_demo_run_is_reproduced_by_the_evaluation_cli",
        "tests/test_cluster.py::test_two_nodes_run_as_one_job",
    ),
    "python examples/train_math.py --config configs/dapo_qwen2.5_32b.yaml --print_plan --num_processes 64": (
        "tests/test_train_math.py::test_print_plan_loads_no_model",
    ),
    # docs/domains.md: the multiple-choice example's CPU demo (a few of its steps)
    "accelerate launch examples/train_domain_qa.py": (
        "tests/test_train_domain_qa.py::test_demo_trains_end_to_end_and_filters_on_the_answer_reward",
    ),
    # docs/prompt_skipping.md: the same script, variants and narrowed RL set, at --quick size
    'python benchmarks/ablation.py --rl-train-size 200 --stem ablation_skip --variants "naive GRPO" '
    '"full DAPO (defaults)" "full DAPO + prompt skipping"': (
        "tests/test_ablation.py::test_quick_run_writes_table_and_png",
    ),
    'python benchmarks/ablation.py --rl-train-size 200 --stem ablation_posterior --variants "full DAPO (defaults)" '
    '"full DAPO + prompt skipping" "full DAPO + posterior skipping"': (
        "tests/test_ablation.py::test_quick_run_writes_table_and_png",
        "tests/test_ablation.py::test_skipping_variant_is_full_dapo_with_prompt_skipping",
    ),
    'python benchmarks/ablation.py --rl-train-size 200 --stem ablation_skip_defaults --variants "full DAPO (defaults)" '
    '"full DAPO + prompt skipping"': (
        "tests/test_ablation.py::test_quick_run_writes_table_and_png",
        "tests/test_ablation.py::test_skipping_variant_is_full_dapo_with_prompt_skipping",
    ),
    # docs/real_model.md: the converter (the tier's fixture runs it), the tier, and the real model through the main job
    "python scripts/get_smollm2.py --output models/SmolLM2-135M-Instruct": (
        "tests/test_real_model.py::test_converted_folder_loads_like_a_hub_checkpoint",
    ),
    "accelerate launch examples/train_math.py --model_name_or_path models/SmolLM2-135M-Instruct --dataset_name "
    "my_problems.jsonl --conversational true --output_dir outputs/my-run": (
        "tests/test_real_model.py::test_train_math_flags_and_the_evaluation_cli_agree_on_the_real_model",
    ),
    "python -m dapo_trl.evaluation --model outputs/my-run --dataset heldout.jsonl": (
        "tests/test_real_model.py::test_train_math_flags_and_the_evaluation_cli_agree_on_the_real_model",
    ),
    "python -m pytest -m real_model": (
        "tests/test_real_model.py::test_dynamic_sampling_refills_and_shapes_real_rambling_completions",
    ),
    "python -m pytest -m real_model --run-slow": (
        "tests/test_real_model.py::test_resume_reproduces_the_uninterrupted_run",
    ),
    "DAPO_TRL_SMOLLM2=models/SmolLM2-135M-Instruct python -m pytest -m real_model --run-slow": (
        "tests/test_real_model.py::test_a_folder_that_is_not_converted_fails_the_tier_instead_of_skipping_it",
    ),
    "OMP_NUM_THREADS=1 python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct": (
        "tests/test_real_model_benchmark.py::test_quick_run_on_the_real_model",
    ),
    "OMP_NUM_THREADS=2 python examples/train_math.py --config configs/smollm2_cpu.yaml": (
        "tests/test_real_model_recipe.py::test_smollm2_cpu_recipe_reduced_writes_the_paired_heldout_change",
    ),
    "OMP_NUM_THREADS=1 python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct --phase unit --rl-seed 0 "
    "--arms grpo dapo dapo_savings dapo_eps02 dapo_no_ds": (
        "tests/test_real_model_benchmark.py::test_unit_phase_appends_each_seed_once_in_the_issue_schema",
    ),
    "OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct --phase unit "
    "--vllm --arms grpo --rl-seed 0 --two-step 0 --warmup-two-step 0.6 --test-size 150 --lr 3e-5 --prompts-per-step 4 "
    "--updates-per-rollout 2 --max-completion-length 32 --overlong-buffer-len 8 --max-rounds 2 --budget-tokens 10000 "
    "--eval-fractions 0.5 1.0 --max-minutes 35": (
        "tests/test_vllm.py::test_the_real_model_benchmark_trains_its_arms_through_vllm",
    ),
    # docs/dapo_vs_grpo.md: a unit of the pre-registered comparison (B is set by the pilot), reduced in the vllm tier
    "OMP_NUM_THREADS=2 nice -n 10 .venv-vllm/bin/python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct "
    "--phase unit --vllm --shared-order --stop-rule nearest --eval-at-start --arms grpo dapo --rl-seed 100 "
    "--two-step 0 --warmup-two-step 0.6 --test-size 1000 --lr 3e-5 --prompts-per-step 4 --updates-per-rollout 2 "
    "--max-completion-length 32 --overlong-buffer-len 0 --max-rounds 0 --budget-tokens B --eval-fractions 0.5 1.0 "
    "--max-minutes 40": (
        "tests/test_vllm.py::test_the_pre_registered_protocol_scores_held_out_problems_through_each_units_engine",
    ),
    "python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct --phase report --shared-order": (
        "tests/test_real_model_paired.py::test_the_committed_report_and_the_readme_follow_from_the_committed_units",
    ),
    ".venv-vllm/bin/python benchmarks/real_model.py --model models/SmolLM2-135M-Instruct --phase rebuild --arms dapo "
    "--rl-seed 100": (
        "tests/test_real_model_paired.py::test_a_unit_is_rebuilt_from_its_recorded_settings_with_one_command",
    ),
    # docs/development.md: the randomized multi-process test
    "python -m pytest tests/test_state_space.py": ("tests/test_state_space.py::test_fixed_draws_of_the_state_space",),
    "python -m pytest tests/test_state_space.py --run-slow -k random": (
        "tests/test_state_space.py::test_random_draws_of_the_state_space",
    ),
    "DAPO_TRL_STATE_SPACE_SEED=7 DAPO_TRL_STATE_SPACE_DRAWS=100 python -m pytest tests/test_state_space.py "
    "--run-slow -k random": ("tests/test_state_space.py::test_random_draws_of_the_state_space",),
    "OMP_NUM_THREADS=1 python benchmarks/real_model.py --quick": (
        "tests/test_real_model_benchmark.py::test_quick_run_on_the_tiny_model_writes_the_table_and_counts_every_generated_token",
    ),
    # docs/development.md
    "make test-fast": ("tests/test_doc_commands.py::test_make_test_fast_selects_the_tests_without_a_tiny_model",),
    "make lint": (".ci/run",),
}


@dataclass(frozen=True)
class Command:
    where: str  # page:line
    text: str  # the command, comment dropped, continuation lines joined, whitespace collapsed
    tag: str | None


def strip_comment(line: str) -> tuple[str, str]:
    """(command, comment) of a shell line: a `#` outside quotes, at the start or after a space, opens the comment."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i:]
    return line, ""


def shell_commands(page: Path, root: Path = ROOT) -> list[Command]:
    """The commands of the page's fenced shell blocks, with the tag that marks each (or None)."""
    commands, fence, heading_comment, pending, start = [], None, "", "", 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = (line.strip()[3:] or "none") if fence is None else None
            heading_comment = ""
            continue
        if fence not in SHELL:
            continue
        code, comment = strip_comment(line)
        if not code.strip():
            heading_comment = comment if comment else ("" if not line.strip() else heading_comment)
            continue
        if not pending:
            start = number
        if code.rstrip().endswith("\\"):
            pending += code.rstrip()[:-1] + " "
            tail_comment = comment
            continue
        text = " ".join((pending + code).split())
        tag = TAG.search(comment) or TAG.search(heading_comment) or (pending and TAG.search(tail_comment))
        commands.append(Command(f"{page.relative_to(root)}:{start}", text, tag.group(1) if tag else None))
        pending, tail_comment = "", ""
    return commands


COMMANDS = [command for page in PAGES for command in shell_commands(page)]


def test_the_collector_sees_the_documented_commands():
    """Known commands of the README and of docs/ are found, with their tags (else this file checks nothing)."""
    texts = {c.text: c.tag for c in COMMANDS}
    assert texts["make demo"] is None and texts["make test"] is None
    assert texts["kubectl apply -f examples/kubernetes/storage.yaml"] == "cluster only"
    assert texts["CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen2.5-7B --max_model_len 10240 &"] == "GPU only"
    assert len(COMMANDS) >= 25, COMMANDS


def test_every_fenced_block_names_its_language():
    """A block without a language could be a shell block that this check would skip."""
    for page in PAGES:
        fence = None
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                if fence is None:
                    assert line.strip()[3:], f"{page.relative_to(ROOT)}:{number}: name the block's language"
                fence = None if fence else "open"


def test_every_documented_command_is_run_or_tagged():
    missing = [f"{c.where}: {c.text}" for c in COMMANDS if c.tag is None and c.text not in COVERED]
    assert not missing, (
        "commands that no test or .ci/run runs; add the test to COVERED in tests/test_doc_commands.py, or tag the "
        f"command {[f'[{t}]' for t in TAGS]} in a shell comment:\n" + "\n".join(missing)
    )


def test_the_registry_holds_no_stale_command_and_names_real_tests():
    documented = {c.text for c in COMMANDS}
    stale = [command for command in COVERED if command not in documented]
    assert not stale, f"COVERED lists commands no page holds any more: {stale}"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command, runners in COVERED.items():
        assert runners, command
        for runner in runners:
            if runner == ".ci/run":
                assert command in ci, f"{command!r}: .ci/run has no such line"
                continue
            file, _, name = runner.partition("::")
            tree = ast.parse((ROOT / file).read_text())
            names = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            assert name in names, f"{command!r}: {runner} does not exist"


def test_the_collector_reads_tags_continuations_and_comments(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        "# a header [GPU only]\n"
        "run one --flag '#not a comment' \\\n"
        "    --more  # trailing\n"
        "run two\n"
        "\n"
        "run three  # [cluster only]\n"
        "run four\n"
        "```\n"
        "```python\nprint('not shell')\n```\n"
    )
    found = [(c.text, c.tag) for c in shell_commands(page, root=tmp_path)]
    assert found == [
        ("run one --flag '#not a comment' --more", "GPU only"),
        ("run two", "GPU only"),
        ("run three", "cluster only"),
        ("run four", None),
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_fast_selects_the_tests_without_a_tiny_model():
    """
    `make test-fast` runs a subset of what `make test` (run by .ci/run) runs: the same pytest, with a marker expression
    that leaves out the tiny-model and multi-process tiers and names only registered markers.
    """
    commands = subprocess.run(["make", "-n", "test-fast"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    pytest_line = next(line for line in commands.splitlines() if " -m pytest" in line)
    expression = re.search(r'-m pytest -m "([^"]+)"', pytest_line).group(1)
    assert expression == "not integration and not distributed", expression
    registered = (ROOT / "pyproject.toml").read_text()
    for marker in re.findall(r"not (\w+)", expression):
        assert f'"{marker}:' in registered, marker
