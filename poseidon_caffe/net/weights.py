"""Weights in and out: copy by layer name from a .caffemodel or NetParameter, share with
another net, and write the net back as a NetParameter or .caffemodel."""
from .. import log
from ..proto import caffe_pb2
from .errors import NetError


class Weights:
    """Part of ``Net``: its learned parameters in and out."""

    def copy_trained_layers_from(self, source, report=True, require_match=True):
        """Copy parameters layer by layer, by name, from a NetParameter or a .caffemodel path
        (Caffe's CopyTrainedLayersFrom, with its messages). Returns the names of the layers
        that received parameters. A source that gives no parameter to a net that has some is
        an error naming it (``require_match``); with ``report``, the layers left without
        weights are named in one warning."""
        from ..io import blobproto_to_array, read_net_weights
        if isinstance(source, str):
            source_name = source
            where = "%s: " % source            # a file names itself in its errors
            # views of the mapped file: only this net's layers are copied out of it
            source, arrays = read_net_weights(source, copy=False)
        else:
            source_name = "the given NetParameter"
            where = ""
            arrays = {l.name: [blobproto_to_array(b) for b in l.blobs] for l in source.layer}
        by_name = {name: i for i, name in enumerate(self.layer_names)}
        copied = []
        for src in source.layer:
            if src.name not in by_name:
                log.info("Ignoring source layer %s", src.name)
                continue
            target = self.layers[by_name[src.name]]
            log.info("Copying source layer %s Type:%s #blobs=%d", src.name, src.type,
                     len(src.blobs))
            if len(src.blobs) != len(target.blobs):
                raise NetError("Incompatible number of blobs for layer %s: the source %s has %d, "
                               "the net has %d" % (src.name, source_name, len(src.blobs),
                                                   len(target.blobs)))
            for j, (blob_proto, array) in enumerate(zip(src.blobs, arrays.get(src.name, []))):
                blob = target.blobs[j]
                if array.shape != blob.shape:
                    # a legacy (num, channels, height, width) blob matches when it is the
                    # target's shape padded with leading 1s, as Caffe's ShapeEquals
                    legacy_ok = (not blob_proto.shape.dim and blob.num_axes <= 4 and
                                 array.shape == (1,) * (4 - blob.num_axes) + blob.shape)
                    if not legacy_ok:
                        raise NetError(
                            "%sCannot copy param %d weights from layer '%s'; shape mismatch.  "
                            "Source param shape is %s (%d); target param shape is %s. To learn "
                            "this layer's parameters from scratch rather than copying from a "
                            "saved net, rename the layer." % (
                                where, j, src.name, " ".join(map(str, array.shape)), array.size,
                                blob.shape_string()))
                blob.data[...] = array.reshape(blob.shape)
            if target.blobs:
                copied.append(src.name)
        if require_match:
            self.check_weights_matched(copied, source_name,
                                       [l.name for l in source.layer if l.blobs])
        if report:
            self.warn_layers_without_weights(copied, [source_name])
        return copied

    def layers_needing_weights(self):
        """Names of the layers that own at least one parameter (a layer whose parameters are
        all shared from another layer takes its weights through that layer)."""
        names = []
        for pid, (layer_index, _) in enumerate(self.param_layer_indices):
            name = self.layer_names[layer_index]
            if self.param_owners[pid] == -1 and name not in names:
                names.append(name)
        return names

    def check_weights_matched(self, copied, source_name, source_layers):
        """A weights source that copied nothing into a net with parameters is almost always the
        wrong file (or the wrong net): say so instead of training or scoring random weights."""
        needing = self.layers_needing_weights()
        if copied or not needing:
            return
        shown = ", ".join(source_layers[:8]) + (", ..." if len(source_layers) > 8 else "")
        raise NetError("%s: no parameter copied into net %r: none of the file's layers with "
                       "parameters (%s) is a layer of the net with parameters (%s)"
                       % (source_name, self.name, shown or "none",
                          ", ".join(needing[:8]) + (", ..." if len(needing) > 8 else "")))

    def warn_layers_without_weights(self, copied, source_names, skip=()):
        """One warning naming every layer with parameters that no weights source filled."""
        done = set(copied) | set(skip)
        missing = [name for name in self.layers_needing_weights() if name not in done]
        if missing:
            log.warning("%d layer(s) with parameters got no weights from %s and keep their "
                        "initial values: %s", len(missing), ", ".join(source_names),
                        ", ".join(missing))
        return missing

    copy_from = copy_trained_layers_from

    def share_trained_layers_with(self, other):
        """Make this net's parameters the same storage as ``other``'s, layer by layer by name
        (test nets see the training net's weights without copying them)."""
        by_name = {name: i for i, name in enumerate(other.layer_names)}
        for i, name in enumerate(self.layer_names):
            if name not in by_name:
                continue
            source = other.layers[by_name[name]]
            target = self.layers[i]
            if len(source.blobs) != len(target.blobs):
                raise NetError("Incompatible number of blobs for layer %s" % name)
            for j, blob in enumerate(source.blobs):
                if blob.shape != target.blobs[j].shape:
                    raise NetError("Cannot share param %d weights from layer '%s'; shape "
                                   "mismatch: %s vs %s" % (j, name, blob.shape_string(),
                                                           target.blobs[j].shape_string()))
                target.blobs[j].share_data(blob)

    share_with = share_trained_layers_with

    def to_proto(self, write_diff=False):
        from ..io import fill_blobproto
        out = caffe_pb2.NetParameter()
        out.CopyFrom(self.param)
        out.ClearField("layer")
        out.state.CopyFrom(self.state)
        for layer, layer_param in zip(self.layers, self.param.layer):
            lp = out.layer.add()
            lp.CopyFrom(layer_param)
            del lp.blobs[:]
            for blob in layer.blobs:
                # read only (Caffe's cpu_data): on a device nothing is copied up again after
                fill_blobproto(lp.blobs.add(), blob.host_data,
                               blob.host_diff if write_diff else None)
        return out

    def save(self, path, write_diff=False):
        """Write the net and its weights as a .caffemodel (atomically)."""
        from ..io import write_net_binary, write_net_weights
        if write_diff:
            write_net_binary(self.to_proto(write_diff=True), path)
            return
        structure = caffe_pb2.NetParameter()
        structure.CopyFrom(self.param)
        structure.state.CopyFrom(self.state)
        for layer_param in structure.layer:
            del layer_param.blobs[:]
        weights = {name: [b.host_data for b in layer.blobs]
                   for name, layer in zip(self.layer_names, self.layers) if layer.blobs}
        write_net_weights(structure, weights, path)
