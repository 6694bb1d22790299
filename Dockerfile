# nas-transformers on the CPU: the image docs/cluster.md's jobs run (search workers, retraining, measurement on CPU nodes).
#
#   docker build -t registry.example.com/nas-transformers:0.2.0 .    # the network is used here, at build time only
#   docker run --rm --network none -v "$PWD/runs:/data/runs" registry.example.com/nas-transformers:0.2.0 nas space tiny
#
# The toolkit is installed by scripts/install.py, as on any machine: PyTorch's CPU build (no CUDA libraries), the
# postgres extra (a shared --storage for search workers) and the versions CI tests (constraints.txt, torch included).
# Nothing is downloaded when a container runs: the default corpus is Python's own standard library, the spaces ship
# with the package, and the compiled attention kernels are off (a slim image has no C++ compiler; the block engine
# computes the same attention).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    NAS_NATIVE_KERNELS=0 \
    MPLBACKEND=Agg

WORKDIR /opt/nas-transformers
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY scripts/install.py scripts/install.py
COPY search_spaces search_spaces
COPY supernet supernet
COPY latency latency
COPY tasks tasks
COPY nas nas
RUN python3 scripts/install.py postgres --torch cpu -c constraints.txt \
    && nas --version && nas space tiny > /dev/null

RUN useradd --create-home --uid 1000 nas && mkdir -p /data && chown nas /data
USER nas
WORKDIR /data
CMD ["nas", "--help"]
