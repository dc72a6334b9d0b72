# Builds talosd, talosctl and talos-mcp-gateway into one small image (used by docker-compose.yml).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -o /out/talosd ./cmd/talosd && \
    CGO_ENABLED=0 go build -trimpath -o /out/talosctl ./cmd/talosctl && \
    CGO_ENABLED=0 go build -trimpath -o /out/talos-mcp-gateway ./cmd/talos-mcp-gateway && \
    mkdir -p /out/keys /out/secrets /out/responder /out/chtls /out/logkey /out/data/tlog

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/talosd /out/talosctl /out/talos-mcp-gateway /usr/local/bin/
# A named volume mounted on /keys starts with this directory's owner, so the
# nonroot user can write and read the signing keys.
COPY --from=build --chown=65532:65532 /out/keys /keys
# Likewise /secrets, where `talosd nats-auth` writes the NATS users, and
# /responder, where the keygen job writes the responder key.
COPY --from=build --chown=65532:65532 /out/secrets /secrets
COPY --from=build --chown=65532:65532 /out/responder /responder
# And /chtls, where the chtls job writes ClickHouse's CA and certificate.
COPY --from=build --chown=65532:65532 /out/chtls /chtls
# And /logkey, where the logkey job writes the transparency log's key, and
# /data, talosd's data dir, whose tlog/ is the log the workers share.
COPY --from=build --chown=65532:65532 /out/logkey /logkey
COPY --from=build --chown=65532:65532 /out/data /data
USER nonroot
ENTRYPOINT ["/usr/local/bin/talosd"]
