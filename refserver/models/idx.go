package models

import (
	"bufio"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// ReadIDX reads an IDX file (optionally gzip-compressed, detected by its
// magic bytes) of unsigned bytes: it returns the dimensions and the data.
func ReadIDX(path string) ([]int, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read idx: %w", err)
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil, fmt.Errorf("read idx %s: %w", path, err)
		}
		defer gz.Close()
		r = gz
	}
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, nil, fmt.Errorf("read idx %s: header: %w", path, err)
	}
	if hdr[0] != 0 || hdr[1] != 0 || hdr[2] != 0x08 {
		return nil, nil, fmt.Errorf("read idx %s: not an unsigned-byte IDX file (magic % x)", path, hdr)
	}
	nd := int(hdr[3])
	if nd < 1 || nd > 4 {
		return nil, nil, fmt.Errorf("read idx %s: %d dimensions", path, nd)
	}
	dims := make([]int, nd)
	total := 1
	for i := range dims {
		var d uint32
		if err := binary.Read(r, binary.BigEndian, &d); err != nil {
			return nil, nil, fmt.Errorf("read idx %s: dims: %w", path, err)
		}
		if d == 0 || d > 1<<24 {
			return nil, nil, fmt.Errorf("read idx %s: dimension %d is %d", path, i, d)
		}
		dims[i] = int(d)
		total *= int(d)
	}
	if total > 1<<30 {
		return nil, nil, fmt.Errorf("read idx %s: %d elements is too many", path, total)
	}
	data := make([]byte, total)
	if _, err := io.ReadFull(r, data); err != nil {
		return nil, nil, fmt.Errorf("read idx %s: data: %w", path, err)
	}
	return dims, data, nil
}

// LoadFashion loads Fashion-MNIST images (scaled to 0..1, [n,784]) and
// labels from dir, which holds {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz;
// set is "train" or "t10k".
func LoadFashion(dir, set string) (images []float32, labels []int, err error) {
	dims, px, err := ReadIDX(fmt.Sprintf("%s/%s-images-idx3-ubyte.gz", dir, set))
	if err != nil {
		return nil, nil, err
	}
	ldims, lb, err := ReadIDX(fmt.Sprintf("%s/%s-labels-idx1-ubyte.gz", dir, set))
	if err != nil {
		return nil, nil, err
	}
	if len(dims) != 3 || dims[1]*dims[2] != 784 || len(ldims) != 1 || ldims[0] != dims[0] {
		return nil, nil, fmt.Errorf("load fashion %s: image dims %v, label dims %v", set, dims, ldims)
	}
	images = make([]float32, len(px))
	for i, b := range px {
		images[i] = float32(b) / 255
	}
	labels = make([]int, len(lb))
	for i, b := range lb {
		if b > 9 {
			return nil, nil, fmt.Errorf("load fashion %s: label %d at %d", set, b, i)
		}
		labels[i] = int(b)
	}
	return images, labels, nil
}

// FashionDir is where the Debian package dataset-fashion-mnist installs
// the dataset.
const FashionDir = "/usr/share/datasets/fashion-mnist"
