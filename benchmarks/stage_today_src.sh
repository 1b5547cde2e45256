#!/usr/bin/env bash
# Stage the src of the checkout before the noise-based stopping rule (b6a32b9's parent: at least
# 10 samples and 0.1 s per point) in .stage/today-src (ignored), for stopping_vs_today.py
# --today-src on the GPU machine, which gets no .git: carry ".stage/today-src" in the run call.
set -eu
cd "$(git rev-parse --show-toplevel)"
rm -rf .stage/today-src && mkdir -p .stage/today-src
git archive b6a32b9^ src | tar -x -C .stage/today-src --strip-components=1
du -sh .stage/today-src | cut -f1 | sed 's/^/staged (size): /'; ls .stage/today-src
