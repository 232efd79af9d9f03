#!/usr/bin/env bash
# The vLLM environment's lock files: [PYTHON=python3.11] envs/lock-vllm.sh cpu|gpu  ->  envs/vllm-<flavour>.lock
#
# Resolves envs/vllm-<flavour>.txt afresh with pip's resolver (`pip install --dry-run --ignore-installed --report`:
# nothing is installed) for the interpreter PYTHON on this machine's platform, and writes every package pip would
# install, pinned exactly, under a header naming the flavour, Python, platform and pip that resolved it.
# envs/make-vllm-env.sh installs the flavour's .txt constrained by its lock, and refuses another Python than the
# lock's. The GPU flavour resolves on any Linux x86-64 machine, a CPU one included: pip reads the metadata of PyPI's
# CUDA wheels without installing them (it downloads each, several GB in all, to a temporary folder). The CPU flavour
# needs torch 2.13.0+cpu where pip finds it (PIP_FIND_LINKS or PyTorch's CPU index), as make-vllm-env does.
# Run it again after changing a pin of envs/vllm-common.txt or envs/vllm-<flavour>.txt; tests/test_packaging.py
# fails while a lock and its pins disagree.
case "${1:-}" in
    cpu | gpu) ;;
    -h | --help) sed -n '2,/^case/{/^case/!s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) echo "usage: [PYTHON=python3.11] envs/lock-vllm.sh cpu|gpu" >&2; exit 2 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=$1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"${PYTHON:-python3}" -m venv "$scratch/venv"
# One pip release for every lock: another resolver may choose other versions from the same index.
"$scratch/venv/bin/pip" install --quiet --disable-pip-version-check pip==26.3
resolve=("$scratch/venv/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir --dry-run
         --ignore-installed --report "$scratch/report.json" -r "envs/vllm-$flavour.txt")
if [ "$flavour" = gpu ]; then
    # Without pip's configuration files and PIP_FIND_LINKS: a CPU wheel of torch found there (the CPU flavour's local
    # wheel) would be taken for PyPI's CUDA one, since 2.13.0+cpu satisfies ==2.13.0. PIP_INDEX_URL still applies.
    env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null "${resolve[@]}"
else
    "${resolve[@]}"
fi
"$scratch/venv/bin/python" - "$flavour" "$scratch/report.json" >"$scratch/lock" <<'EOF'
import json, platform, sys, sysconfig

flavour, report = sys.argv[1], json.load(open(sys.argv[2]))
pins = sorted((p["metadata"]["name"], p["metadata"]["version"]) for p in report["install"])
torch = dict(pins)["torch"]
if (flavour == "gpu") == torch.endswith("+cpu"):  # pip took a local CPU wheel for CUDA's, or the reverse
    sys.exit(f"lock-vllm.sh {flavour}: pip resolved torch {torch}; check PIP_FIND_LINKS and the index")
python = ".".join(platform.python_version_tuple()[:2])
print(f"# Every package of the vLLM environment's {flavour} flavour, pinned: envs/lock-vllm.sh {flavour} resolved")
print(f"# envs/vllm-{flavour}.txt with pip {report['pip_version']} for CPython {python} on {sysconfig.get_platform()}"
      f" (glibc {platform.libc_ver()[1]}).")
print("# Constraints for envs/make-vllm-env.sh, which refuses another Python; do not edit: run the script again.")
print(f"# python: {python}")
print("\n".join(f"{name}=={version}" for name, version in sorted(pins, key=lambda p: p[0].lower())))
EOF
mv "$scratch/lock" "envs/vllm-$flavour.lock"  # a lock is replaced whole or not at all
echo "lock-vllm.sh: $(grep -c '==' "envs/vllm-$flavour.lock") packages in envs/vllm-$flavour.lock"
