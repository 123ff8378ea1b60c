package loadgen

import (
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"

	"github.com/hams-go/hams/internal/config"
	"github.com/hams-go/hams/internal/tensor"
	hamsv1 "github.com/hams-go/hams/protos/hams/v1"
)

// FashionDir is where the Fashion-MNIST IDX files are looked for.
var FashionDir = "/usr/share/datasets/fashion-mnist"

// LabelFraction is the share of rows of an INT64 "labels" input that carry
// a label (the others carry -1: predict only).
const LabelFraction = 0.3

// Dataset is a set of images (rows of 784 floats in [0,1]) with labels.
type Dataset struct {
	Images [][]float32
	Labels []int64
}

var (
	fashionOnce sync.Once
	fashion     *Dataset
)

// Fashion returns the Fashion-MNIST test set if it is installed, else nil.
func Fashion() *Dataset {
	fashionOnce.Do(func() {
		d, err := LoadIDX(filepath.Join(FashionDir, "t10k-images-idx3-ubyte.gz"), filepath.Join(FashionDir, "t10k-labels-idx1-ubyte.gz"))
		if err == nil {
			fashion = d
		}
	})
	return fashion
}

func readGz(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("gunzip %s: %w", path, err)
	}
	return io.ReadAll(zr)
}

// LoadIDX reads gzipped IDX image (magic 2051) and label (magic 2049) files.
func LoadIDX(imagesPath, labelsPath string) (*Dataset, error) {
	ib, err := readGz(imagesPath)
	if err != nil {
		return nil, err
	}
	lb, err := readGz(labelsPath)
	if err != nil {
		return nil, err
	}
	if len(ib) < 16 || binary.BigEndian.Uint32(ib) != 2051 {
		return nil, fmt.Errorf("loadgen: %s is not an IDX image file", imagesPath)
	}
	if len(lb) < 8 || binary.BigEndian.Uint32(lb) != 2049 {
		return nil, fmt.Errorf("loadgen: %s is not an IDX label file", labelsPath)
	}
	n := int(binary.BigEndian.Uint32(ib[4:]))
	h, w := int(binary.BigEndian.Uint32(ib[8:])), int(binary.BigEndian.Uint32(ib[12:]))
	if int(binary.BigEndian.Uint32(lb[4:])) != n || len(ib) != 16+n*h*w || len(lb) != 8+n {
		return nil, fmt.Errorf("loadgen: IDX files %s, %s disagree on size", imagesPath, labelsPath)
	}
	d := &Dataset{Images: make([][]float32, n), Labels: make([]int64, n)}
	for i := range n {
		img := make([]float32, h*w)
		for j, p := range ib[16+i*h*w : 16+(i+1)*h*w] {
			img[j] = float32(p) / 255
		}
		d.Images[i] = img
		d.Labels[i] = int64(lb[8+i])
	}
	return d, nil
}

// Generator makes seeded client inputs for one service. Not safe for
// concurrent use; give each client its own (NewGenerator with seed+i).
type Generator struct {
	svc  *config.Service
	rng  *rand.Rand
	data *Dataset
	rows int
}

// NewGenerator returns a generator of requests with rows rows (>= 1) each.
// data may be nil (uniform random pixels); pass Fashion() for real images.
func NewGenerator(svc *config.Service, seed uint64, rows int, data *Dataset) (*Generator, error) {
	if svc == nil {
		return nil, fmt.Errorf("loadgen: nil service")
	}
	if len(svc.Inputs) == 0 {
		return nil, fmt.Errorf("loadgen: service %q declares no inputs", svc.Name)
	}
	if rows < 1 {
		return nil, fmt.Errorf("loadgen: rows %d < 1", rows)
	}
	for _, in := range svc.Inputs {
		if in.Datatype != tensor.FP32 && in.Datatype != tensor.Int64 {
			return nil, fmt.Errorf("loadgen: service %q input %q: datatype %s not supported (FP32, INT64)", svc.Name, in.Name, in.Datatype)
		}
	}
	return &Generator{svc: svc, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), data: data, rows: rows}, nil
}

// Inputs returns one request's input tensors.
func (g *Generator) Inputs() []*hamsv1.Tensor {
	var imgIdx []int // image chosen per row, shared by images and labels
	if g.data != nil && len(g.data.Images) > 0 {
		imgIdx = make([]int, g.rows)
		for i := range imgIdx {
			imgIdx[i] = g.rng.IntN(len(g.data.Images))
		}
	}
	out := make([]*hamsv1.Tensor, 0, len(g.svc.Inputs))
	for _, in := range g.svc.Inputs {
		shape := g.shape(in.Shape)
		per := int64(1)
		for _, d := range shape[1:] {
			per *= d
		}
		n := int(shape[0] * per)
		switch in.Datatype {
		case tensor.FP32:
			v := make([]float32, n)
			if imgIdx != nil && per == 784 {
				for r := range g.rows {
					copy(v[r*784:], g.data.Images[imgIdx[r]])
				}
			} else {
				for i := range v {
					v[i] = g.rng.Float32()
				}
			}
			out = append(out, tensor.FromFloat32(in.Name, shape, v))
		case tensor.Int64:
			v := make([]int64, n)
			for i := range v {
				switch {
				case in.Name != "labels":
					v[i] = g.rng.Int64N(10)
				case g.rng.Float64() >= LabelFraction:
					v[i] = -1
				case imgIdx != nil && per == 1:
					v[i] = g.data.Labels[imgIdx[i]]
				default:
					v[i] = g.rng.Int64N(10)
				}
			}
			out = append(out, tensor.FromInt64(in.Name, shape, v))
		}
	}
	return out
}

// shape resolves a declared shape: dim 0 is the row count, other variable
// dims become 1. A rank-0 or rank-1 declaration gets a row dimension.
func (g *Generator) shape(decl []int64) []int64 {
	if len(decl) == 0 {
		return []int64{int64(g.rows), 1}
	}
	s := make([]int64, len(decl))
	s[0] = int64(g.rows)
	for i := 1; i < len(decl); i++ {
		s[i] = decl[i]
		if s[i] < 0 {
			s[i] = 1
		}
	}
	return s
}
