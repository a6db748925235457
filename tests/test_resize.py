"""The image resize of the ``resize`` wrapper (Doom frames, any image env): block means rounded half
up for unsigned images, float means kept as float, nearest pixel for factors that are not whole."""
import numpy as np

from marlkit.envs.wrappers import resize_images


def reference(x: np.ndarray, h: int, w: int) -> np.ndarray:
    H, W = x.shape[-2:]
    mean = x.reshape(*x.shape[:-2], h, H // h, w, W // w).astype(np.float64).mean(axis=(-3, -1))
    return np.floor(mean + 0.5)


def test_unsigned_images_get_block_means_rounded_half_up():
    blocks = np.array([[0, 0, 0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 1, 2, 1, 2]], np.uint8)   # means 0.25, 0.5, 1.25, 1.5
    assert resize_images(blocks, (1, 4)).tolist() == [[0, 1, 1, 2]]
    rng = np.random.default_rng(0)
    for dtype, shape, size in ((np.uint8, (2, 4, 120, 160), (30, 40)), (np.uint8, (3, 120, 160), (60, 80)),
                               (np.uint8, (1, 9, 9), (3, 3)), (np.uint16, (2, 12, 18), (4, 6))):
        x = rng.integers(0, np.iinfo(dtype).max, shape, endpoint=True).astype(dtype)
        out = resize_images(x, size)
        assert out.dtype == dtype and out.shape == shape[:-2] + size
        np.testing.assert_array_equal(out, reference(x, *size))
    full = np.full((1, 120, 160), 255, np.uint8)
    assert (resize_images(full, (30, 40)) == 255).all()


def test_float_images_keep_their_means_and_uneven_factors_take_the_nearest_pixel():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_allclose(resize_images(x, (2, 2)), [[2.5, 4.5], [10.5, 12.5]])
    assert resize_images(x, (3, 3)).tolist() == [[0, 1, 2], [4, 5, 6], [8, 9, 10]]
    assert resize_images(x, (4, 4)) is x
