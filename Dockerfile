# keylane: one image for every role (receiver, worker, Flower, CLI); docker-compose.yml
# picks the role with the command. Build: docker build -t keylane .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Dependencies first, from pyproject.toml alone (empty packages stand in for the code), so
# a code change does not reinstall them. README.md is optional here: the glob copies it
# when present, and setuptools only warns when it is not.
COPY pyproject.toml README.m[d] /tmp/src/
RUN mkdir /tmp/src/producers /tmp/src/routing /tmp/src/workers /tmp/src/ops \
    && pip install /tmp/src \
    && pip uninstall --yes keylane

# The project itself, installed as a regular (non-editable) package; the source tree is
# removed, so nothing can shadow the installed packages.
COPY producers /tmp/src/producers
COPY routing /tmp/src/routing
COPY workers /tmp/src/workers
COPY ops /tmp/src/ops
RUN pip install --no-deps /tmp/src \
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

EXPOSE 8000 5555
CMD ["keylane", "--help"]
