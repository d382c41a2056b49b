#include <gtest/gtest.h>

#include "core/tensor.h"

using namespace deepinfer;

TEST(Tensor, ViewsShareStorageAndIndexCorrectly) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[i] = float(i) * 1.5f - 7.f;
  Tensor t = Tensor::from_vector(v, {2, 3, 4});
  Tensor s = t.slice(1, 1, 3).select(2, 2);  // [2,2]: t[:,1:3,2]
  ASSERT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_FALSE(s.is_contiguous());
  Tensor c = s.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FLOAT_EQ(c.data<float>()[0], v[1 * 4 + 2]);
  EXPECT_FLOAT_EQ(c.data<float>()[3], v[12 + 2 * 4 + 2]);
  Tensor tr = t.transpose(0, 2).contiguous();  // [4,3,2]
  EXPECT_FLOAT_EQ(tr.data<float>()[(3 * 3 + 1) * 2 + 1], v[12 + 4 + 3]);
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
}

TEST(Tensor, ConversionsRoundTrip) {
  std::vector<float> v = {0.f, 1.f, -2.5f, 3.140625f, -448.f, 1e-3f};
  Tensor t = Tensor::from_vector(v, {6});
  Tensor b = t.to(DType::kBF16).to_f32();
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(b.data<float>()[i], v[i], std::abs(v[i]) * 4e-3f);
  Tensor f8 = t.to(DType::kF8E4M3).to_f32();
  EXPECT_FLOAT_EQ(f8.data<float>()[4], -448.f);
  EXPECT_FLOAT_EQ(f8.data<float>()[2], -2.5f);
}

TEST(Tensor, BadViewsThrow) {
  Tensor t = Tensor::zeros({4, 4}, DType::kF32);
  EXPECT_THROW(t.view({5, 3}), InternalError);
  EXPECT_THROW(t.slice(0, 2, 5), InternalError);
}
