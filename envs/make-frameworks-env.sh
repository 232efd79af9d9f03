#!/usr/bin/env bash
# The frameworks environment (`make frameworks-env`): envs/make-frameworks-env.sh [VENV] [PROJECT_VENV]
#
# A virtual environment (default .venv-frameworks) for tests/test_frameworks.py, which imports verl, OpenRLHF, SkyRL,
# AReaL, TRL and polgrad from their pinned PyPI releases (envs/frameworks.txt) and checks kl.py against their code.
# It installs no torch: it sees the project's venv (default .venv) after its own site-packages, through a .pth file,
# so torch, numpy, transformers and the rest come from there while nothing of the frameworks enters the project's
# venv, and a framework's copy of a package shadows the project's (TRL 1.9.2 over its TRL 1.16.0).
# - each release of envs/frameworks.txt, without its dependencies, into <venv>/frameworks/<name>-<version>: the
#   tests put one such folder on sys.path while importing from it (tests/framework_stubs);
# - the small packages of envs/frameworks-deps.txt, without dependencies, into the venv's own site-packages.
# pip is the project venv's, with --target: a pip run in this environment would see the project's packages as its
# own and uninstall them on an upgrade.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv-frameworks}
project=${2:-.venv}
# PIP_FLAGS (the Makefile's): e.g. --no-compile, which CI's throwaway environment uses.
read -r -a pip_flags <<<"${PIP_FLAGS:-}"
pip=("$project/bin/pip" install --quiet --disable-pip-version-check --no-deps "${pip_flags[@]}")

if [ "$(realpath -m "$venv")" = "$(realpath -m "$project")" ]; then
    echo "make-frameworks-env: the frameworks environment cannot be the project's venv ($venv)" >&2
    exit 2
fi
rm -rf "$venv"
"$project/bin/python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
project_site=$("$project/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir, not a bare path: the project venv's own .pth files (klstudy's editable install) are read too. The
# name sorts last, so the frameworks environment's packages come first on sys.path.
echo "import site; site.addsitedir('$(cd "$project_site" && pwd)')" >"$site/zzz-project-venv.pth"

"${pip[@]}" --target "$site" -r envs/frameworks-deps.txt
grep -v '^\s*\(#\|$\)' envs/frameworks.txt | while read -r pin; do
    "${pip[@]}" --target "$venv/frameworks/${pin/==/-}" "$pin"
done
echo "make-frameworks-env: $(ls "$venv/frameworks" | wc -l) releases in $venv/frameworks"
