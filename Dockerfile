# The hams image: the static binary (CGO_ENABLED=0, -tags nocuda: no libc,
# no libcuda) and the example deployments, FROM scratch. `make docker`
# builds bin/hams-static and then this image; nothing is pulled.
FROM scratch
COPY bin/hams-static /hams
COPY examples /examples
ENTRYPOINT ["/hams"]
