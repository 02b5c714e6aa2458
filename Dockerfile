# syntax=docker/dockerfile:1
#
# mongoguard container image.
#   docker build -t mongoguard .
#   docker build --build-arg MONGOGUARD_GIT_COMMIT=$(git rev-parse --short HEAD) -t mongoguard .
#   docker build --build-arg PGO=0 -t mongoguard .     # plain release build, quicker
#   docker run -p 27017:27017 -p 9216:9216 \
#     -v ./mongoguard.toml:/etc/mongoguard/mongoguard.toml:ro mongoguard
#
# The image's default configuration is packaging/docker/mongoguard.toml (listens on
# 0.0.0.0:27017, admin on 0.0.0.0:9216); mount your own over /etc/mongoguard/mongoguard.toml.
# Also used by docker-compose.yml (integration/run.sh).

FROM rust:1-bookworm AS build
# The build context has no .git (see .dockerignore): pass the commit for --version.
ARG MONGOGUARD_GIT_COMMIT=unknown
# 1: the profile-guided build (scripts/build-pgo.sh: an instrumented build, a training run
# against the stand-in, the optimised build; about twice the build time, ~25 % less CPU per
# request, docs/performance.md). 0: a plain `cargo build --release`.
ARG PGO=1
WORKDIR /src
COPY . .
# Cache mounts keep the registry and the target dir between builds; the binary is copied out
# of the cached target dir because cache mounts are not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    export MONGOGUARD_GIT_COMMIT="${MONGOGUARD_GIT_COMMIT}" \
    && if [ "$PGO" = 1 ]; then \
        bash scripts/build-pgo.sh && install -D -m 0755 target/pgo/mongoguard /out/mongoguard; \
    else \
        cargo build --release --locked -p mongoguard --bin mongoguard \
        && install -D -m 0755 target/release/mongoguard /out/mongoguard; \
    fi

FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 mongoguard \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin mongoguard \
    && install -d -o 10001 -g 10001 -m 0750 /var/log/mongoguard
COPY --from=build /out/mongoguard /usr/local/bin/mongoguard
COPY packaging/docker/mongoguard.toml /etc/mongoguard/mongoguard.toml
USER 10001:10001
# 27017: MongoDB clients; 9216: admin (/healthz, /readyz, /metrics).
EXPOSE 27017 9216
# GET /healthz on the admin port with bash's /dev/tcp: the slim image has no curl or wget.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9216 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
# SIGTERM (docker stop) drains for drain_timeout: give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/mongoguard"]
CMD ["--config", "/etc/mongoguard/mongoguard.toml"]
