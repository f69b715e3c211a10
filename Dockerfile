# nmt-service: the HTTP translation API (`nmt serve`) with the shipped en-de model.
#
#   GPU (default; PyPI's torch wheel is the CUDA build, the host needs only the NVIDIA driver
#   and the NVIDIA Container Toolkit):
#     docker build -t nmt:cuda .
#     docker run --gpus all -p 8000:8000 nmt:cuda
#   CPU only (torch from PyTorch's CPU index; ~1.2 GB instead of several GB):
#     docker build -t nmt:cpu --build-arg TORCH_VARIANT=cpu .
#     docker run -p 8000:8000 nmt:cpu
#   Offline / air-gapped / mirrored torch: put the torch wheel into ./wheels/ (never committed)
#   and it is installed from there instead of TORCH_INDEX_URL; see docs/container.md.
#   podman: add `--format docker`, or the OCI image format drops the HEALTHCHECK.
#
# Build arguments:
#   TORCH_VARIANT    cuda (default) | cpu
#   TORCH_VERSION    must satisfy the pin in pyproject.toml (default 2.13.0)
#   TORCH_INDEX_URL  index torch is installed from. Default: PyPI (the CUDA build) for cuda,
#                    https://download.pytorch.org/whl/cpu for cpu. For another CUDA version use
#                    e.g. https://download.pytorch.org/whl/cu126 (with TORCH_VARIANT=cuda).
#   REQUIRE_MODEL    1 (default): the build fails unless checkpoints/en-de and checkpoints/de-en
#                    are loadable checkpoints. 0: build without them and mount models at run time
#                    (NMT_MODEL_DIRS).
#   PIP_INDEX_URL    where the other dependencies come from (default https://pypi.org/simple).

ARG PYTHON_IMAGE=python:3.11-slim

# ---------------------------------------------------------------------------------------------
# build: a virtual environment in /opt/venv with torch, the dependencies and the package
FROM ${PYTHON_IMAGE} AS build

ARG TORCH_VARIANT=cuda
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=
# pip reads it from the environment: point it at a mirror if PyPI is not reachable
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv

# Optional local wheels (./wheels/*.whl). The glob lets the directory be absent; pyproject.toml
# is only there because a COPY needs at least one source that exists (pip ignores it); so an
# edit of pyproject.toml also reinstalls torch.
COPY pyproject.toml wheel[s] /tmp/wheels/

# torch first, in its own layer: it is by far the largest and changes least.
RUN set -eu; \
    case "$TORCH_VARIANT" in \
      cpu)  spec="torch==${TORCH_VERSION}+cpu"; index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}" ;; \
      cuda) spec="torch==${TORCH_VERSION}";     index="${TORCH_INDEX_URL:-}" ;; \
      *)    echo "TORCH_VARIANT must be 'cuda' or 'cpu', not '$TORCH_VARIANT'" >&2; exit 1 ;; \
    esac; \
    if ls /tmp/wheels/torch-*.whl >/dev/null 2>&1; then \
      echo "installing $spec from the local wheels/ directory"; \
      pip install --no-index --find-links /tmp/wheels --no-deps "$spec"; \
      pip install --find-links /tmp/wheels "$spec"; \
    elif [ -n "$index" ]; then \
      pip install --index-url "$index" "$spec"; \
    else \
      pip install "$spec"; \
    fi; \
    python -W ignore -c "import sys, torch; cuda = torch.version.cuda; print('torch', torch.__version__, 'cuda', cuda); \
sys.exit(0 if (cuda is not None) == ('$TORCH_VARIANT' == 'cuda') else \
'torch build does not match TORCH_VARIANT=$TORCH_VARIANT (is a wheel of the other variant in wheels/?)')"; \
    rm -rf /tmp/wheels

# The other dependencies, from pyproject.toml alone, so editing the code does not reinstall them.
COPY pyproject.toml /src/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The package itself (nmt: the command; model, app, app/static, and training: the `nmt corpus|train|eval`
# commands),
# installed (not editable) into the venv.
COPY nmt/ /src/nmt/
COPY model/ /src/model/
COPY app/ /src/app/
COPY training/ /src/training/
RUN pip install --no-deps /src \
 && python -c "import nmt.cli, model.translator" \
 && nmt --help >/dev/null

# ---------------------------------------------------------------------------------------------
# model: the shipped checkpoint, made world-readable (safetensors writes model.safetensors with
# mode 0600) here rather than in the runtime stage, where a chmod would store the weights twice
FROM build AS model
ARG REQUIRE_MODEL=1
# .dockerignore lets in only the files of the checkpoint directories checkpoints/en-de and de-en
COPY checkpoints/ /opt/nmt/checkpoints/
RUN set -eu; \
    chmod -R u=rwX,go=rX /opt/nmt; \
    for pair in en-de de-en; do \
      if [ -e /opt/nmt/checkpoints/$pair/config.json ] || [ "$REQUIRE_MODEL" = 1 ]; then \
        python -c "import sys; from model.checkpoint import load_checkpoint; \
m, _, meta = load_checkpoint(sys.argv[1]); \
print('model', sys.argv[1], meta.get('source_lang'), '->', meta.get('target_lang'), sum(p.numel() for p in m.parameters()), 'parameters')" \
          /opt/nmt/checkpoints/$pair \
        || { echo "checkpoints/$pair is missing or not a loadable checkpoint (git lfs pull?). Build with --build-arg REQUIRE_MODEL=0 to leave the models out and mount them at run time." >&2; exit 1; }; \
      else \
        echo "WARNING: no checkpoints/$pair in the image (REQUIRE_MODEL=0): mount models and set NMT_MODEL_DIRS"; \
      fi; \
    done

# ---------------------------------------------------------------------------------------------
# runtime: the venv, the model, an unprivileged user
FROM ${PYTHON_IMAGE} AS runtime

ARG TORCH_VARIANT=cuda
LABEL org.opencontainers.image.title="nmt-service" \
      org.opencontainers.image.description="Transformer machine translation HTTP service (nmt serve)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      nmt.torch-variant="${TORCH_VARIANT}"

# g++: torch's extension loader compiles the CPU kernels (model/kernels/*.cpp) for the CPU the
# container runs on; they are built below for the build host's CPU and rebuilt at start only
# where the CPU's vector instructions differ (without g++ decoding falls back to PyTorch ops).
# The Python headers come with python:3.11-slim; python3-dev only where an image lacks them.
RUN set -eu; \
    packages=g++; \
    include=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['include'])"); \
    [ -e "$include/Python.h" ] || packages="$packages python3-dev"; \
    apt-get update; \
    apt-get install -y --no-install-recommends $packages; \
    rm -rf /var/lib/apt/lists/*

# a fixed numeric uid, so runAsNonRoot-style checks can verify it and mounts can be chown'ed to it
RUN groupadd --gid 10001 nmt \
 && useradd --uid 10001 --gid nmt --home-dir /home/nmt --create-home --shell /usr/sbin/nologin --no-log-init nmt

COPY --from=build /opt/venv /opt/venv
# owned by root: read-only for the service
COPY --from=model /opt/nmt /opt/nmt

# NVIDIA_DRIVER_CAPABILITIES: the driver libraries the NVIDIA toolkit mounts (unset means
# utility only, without CUDA); which GPUs is left to --gpus / the compose reservation.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NMT_MODEL_DIRS=/opt/nmt/checkpoints/en-de,/opt/nmt/checkpoints/de-en \
    NMT_HOST=0.0.0.0 \
    NMT_PORT=8000 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

USER 10001:10001
WORKDIR /home/nmt
# the SQLite files (API keys, suggestions; NMT_KEYS_DB, NMT_SUGGESTIONS_DB): a volume mounted here
# starts owned by the service's user
RUN mkdir -p /home/nmt/db
# into the user's ~/.cache/torch_extensions, where the service finds them, for this CPU's vector
# width and the narrower ones it can run (AVX-512 and AVX2 on an AVX-512 build host). With a
# writable root the service rebuilds there for other CPUs; with a read-only one (compose) it
# uses these as they are, or falls back to PyTorch ops on a CPU none of them fits.
RUN python -c "from model import kernels; print('CPU kernels built for', kernels.prebuild())"
EXPOSE 8000

# /ready answers 200 once the workers have loaded the models.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4).status != 200)"]

CMD ["nmt", "serve", "--host", "0.0.0.0", "--port", "8000"]
