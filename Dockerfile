# keylane: one image for every role (receiver, worker, Flower, CLI); docker-compose.yml
# picks the role with the command. Build: docker build -t keylane .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, from pyproject.toml alone (its [project] dependencies, with their
# ranges, as `pip install keylane` resolves them), so a code change does not reinstall them.
COPY pyproject.toml /tmp/src/
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/src/pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# The project itself, installed exactly as users install it and as the test suite checks
# (tests/test_install.py): `pip install .`, no extras, not editable. pyproject.toml maps
# the four folders in as keylane.routing, .producers, .workers and .ops; the source tree
# is removed afterwards, so nothing can shadow the installed package.
COPY README.md /tmp/src/
COPY keylane /tmp/src/keylane
COPY producers /tmp/src/producers
COPY routing /tmp/src/routing
COPY workers /tmp/src/workers
COPY ops /tmp/src/ops
RUN pip install /tmp/src \
    && rm -rf /tmp/src \
    && keylane --help > /dev/null

# A non-root user, and the data directory (SQLite store) it owns; a named volume mounted
# on /data starts with this ownership.
RUN groupadd --system --gid 10001 keylane \
    && useradd --system --uid 10001 --gid keylane --home-dir /home/keylane --create-home \
        --shell /usr/sbin/nologin keylane \
    && mkdir -p /data \
    && chown keylane:keylane /data
USER keylane
WORKDIR /home/keylane
ENV KEYLANE_DATA_DIR=/data
VOLUME ["/data"]

# 8000: a receiver's webhook port (the one to put on the internet); 8100: its operations
# listener (/metrics: keylane serve --ops-host 0.0.0.0 for a scraper on the container's
# network; loopback otherwise); 5555: Flower (on 0.0.0.0 only with KEYLANE_FLOWER_BASIC_AUTH)
EXPOSE 8000 8100 5555
CMD ["keylane", "--help"]
